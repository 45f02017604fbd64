// Package httpapi serves the v1 HTTP API: it implements the strict server interface
// generated from openapi.yaml, validates input, and maps broker errors to JSON error
// bodies in one place (errors.go). It reaches the broker only through the Broker
// interface it declares.
//
// The handler stack's costs (BenchmarkHTTP*, against a broker that answers at once) are
// measured by make bench-go and kept, dated, in docs/performance.md; a batch body is
// decoded once (decoded.go) because decoding it twice was a quarter of produce-batch.
package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path"
	"reflect"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/reqid"
)

// Options configures the HTTP API.
type Options struct {
	// Logger receives request errors; nil means slog.Default().
	Logger *slog.Logger
	// Metrics is where request counts go and what /metrics serves; nil disables both.
	Metrics *broker.Metrics
	// AuthEnabled reports whether requests must carry credentials (HTTP Basic); nil or
	// false means security is off.
	AuthEnabled func() bool
	// ProtectMetrics requires an admin's credentials for /metrics when auth is on (its
	// labels name every topic); cmd/narad sets it unless --metrics-public.
	ProtectMetrics bool
	// AuthFailureDelay is the longest delay before answering a client that keeps
	// failing to log in (0: none).
	AuthFailureDelay time.Duration
	// AllowedHosts are the Host names a broker without security serves besides
	// loopback names and IP addresses (".example.com": its subdomains; "*": any). See
	// origin.go.
	AllowedHosts []string
	// MaxInflightBytes bounds the request body bytes held at once, node-wide (see
	// bodyBudget); 0 means DefaultMaxInflightBytes, negative means no bound.
	MaxInflightBytes int64
}

// New returns the API's handler.
func New(b Broker, opts Options) (http.Handler, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	spec, err := apigen.GetSwagger()
	if err != nil {
		return nil, fmt.Errorf("httpapi: loading the embedded spec: %w", err)
	}
	authn := newAuthenticator(b.User, opts.AuthFailureDelay, opts.Logger, opts.Metrics)
	if b.Clustered() {
		authn.catchUp = b.CatchUp
	}
	h := &handlers{b: b, authn: authn}
	mux := http.NewServeMux()
	middlewares := []apigen.StrictMiddlewareFunc{h.authorize}
	strict := apigen.NewStrictHandlerWithOptions(h, middlewares, apigen.StrictHTTPServerOptions{
		RequestErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				writeError(w, err)
				return
			}
			writeError(w, newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidJson, "the body is not valid JSON for this operation: "+err.Error()))
		},
		ResponseErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, err)
		},
	})
	d := decodedOnce{ServerInterface: strict, h: h, middlewares: middlewares}
	// No router Middlewares here: serveDirect (direct.go) repeats the generated
	// router's steps for produce, consume and ack, and would skip them.
	apigen.HandlerWithOptions(d, apigen.StdHTTPServerOptions{
		BaseRouter: mux,
		ErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, paramError(err))
		},
	})
	s := &server{mux: mux, d: d, log: opts.Logger, metrics: opts.Metrics, ops: indexOps(spec),
		authOn: opts.AuthEnabled, protectMetrics: opts.ProtectMetrics, authn: authn,
		hosts: newHostRules(opts.AllowedHosts)}
	if s.authOn == nil {
		s.authOn = func() bool { return false }
	}
	if s.metrics != nil {
		for _, oi := range s.ops {
			oi.duration = s.metrics.HTTPDuration.WithLabelValues(oi.id)
		}
	}
	switch {
	case opts.MaxInflightBytes == 0:
		s.bodies = newBodyBudget(DefaultMaxInflightBytes, opts.Metrics)
	case opts.MaxInflightBytes > 0:
		s.bodies = newBodyBudget(opts.MaxInflightBytes, opts.Metrics)
	default:
		s.bodies = newBodyBudget(0, opts.Metrics)
	}
	mux.HandleFunc("/", s.noRoute)
	if opts.Metrics != nil {
		s.promHandler = promhttp.HandlerFor(opts.Metrics.Registry, promhttp.HandlerOpts{})
	}
	return s, nil
}

type server struct {
	mux         *http.ServeMux
	d           decodedOnce     // the direct routes' steps (serveDirect); without h, none is direct
	directHook  func(op string) // a test's: told of each request served directly
	log         *slog.Logger
	metrics     *broker.Metrics
	promHandler http.Handler
	ops         map[string]*opInfo

	authOn         func() bool
	protectMetrics bool
	authn          *authenticator
	hosts          hostRules
	bodies         *bodyBudget

	// refusedLogs bounds the "request refused" lines (see logOutcome).
	refusedMu   sync.Mutex
	refusedLogs logLimit
}

type opInfo struct {
	id   string
	op   *openapi3.Operation
	body *openapi3.RequestBody // JSON request body, nil if none
	// query holds the length bounds of the operation's string query parameters, which
	// the generated binder does not check.
	query map[string]lengthBounds
	// params are the names of the operation's query parameters, sorted; any other is
	// refused, as an unknown body field is.
	params []string
	// duration is the operation's request-duration histogram (nil without metrics),
	// looked up once rather than by its label at every request.
	duration prometheus.Observer
}

// lengthBounds are a string parameter's minLength and maxLength (max -1: none), in
// characters as JSON Schema counts them.
type lengthBounds struct{ min, max int }

// indexOps maps "METHOD /path/{param}" (the pattern the generated router registers) to
// the spec's operation.
func indexOps(spec *openapi3.T) map[string]*opInfo {
	out := make(map[string]*opInfo)
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			// The embedded spec carries Go-style ids (Produce); metrics and switches use
			// the spec's own spelling (produce).
			id := op.OperationID
			if id != "" {
				id = strings.ToLower(id[:1]) + id[1:]
			}
			oi := &opInfo{id: id, op: op, query: queryBounds(item.Parameters, op.Parameters), params: queryNames(item.Parameters, op.Parameters)}
			if op.RequestBody != nil && op.RequestBody.Value != nil && op.RequestBody.Value.Content["application/json"] != nil {
				oi.body = op.RequestBody.Value
			}
			out[method+" "+path] = oi
		}
	}
	return out
}

// queryBounds collects the length bounds of the string query parameters of a path and
// one of its operations.
func queryBounds(lists ...openapi3.Parameters) map[string]lengthBounds {
	var out map[string]lengthBounds
	for _, ps := range lists {
		for _, ref := range ps {
			p := ref.Value
			if p == nil || p.In != openapi3.ParameterInQuery || p.Schema == nil || p.Schema.Value == nil {
				continue
			}
			s := p.Schema.Value
			if !s.Type.Is(openapi3.TypeString) || (s.MaxLength == nil && s.MinLength == 0) {
				continue
			}
			b := lengthBounds{min: int(s.MinLength), max: -1}
			if s.MaxLength != nil {
				b.max = int(*s.MaxLength)
			}
			if out == nil {
				out = make(map[string]lengthBounds)
			}
			out[p.Name] = b
		}
	}
	return out
}

// queryNames lists the query parameters of a path and one of its operations, sorted.
func queryNames(lists ...openapi3.Parameters) []string {
	var out []string
	for _, ps := range lists {
		for _, ref := range ps {
			if p := ref.Value; p != nil && p.In == openapi3.ParameterInQuery && !slices.Contains(out, p.Name) {
				out = append(out, p.Name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// checkQueryNames refuses a query parameter the operation does not take: the generated
// binder ignores it, so a misspelt ?partiton=1 would produce to any partition.
func checkQueryNames(oi *opInfo, q url.Values) error {
	if oi == nil {
		return nil
	}
	switch oi.id {
	case "healthz", "readyz", "metrics":
		return nil // probes and scrapers may add parameters of their own; nothing reads them
	}
	// The first unknown name in byte order, so that the same request always gets the
	// same message (a map's order is random).
	name, found := "", false
	for n := range q {
		if !slices.Contains(oi.params, n) && (!found || n < name) {
			name, found = n, true
		}
	}
	switch {
	case !found:
		return nil
	case len(oi.params) == 0:
		return badParam("unknown query parameter " + strconv.Quote(clip(name, maxEcho)) + ": this operation takes none")
	}
	return badParam("unknown query parameter " + strconv.Quote(clip(name, maxEcho)) + ": this operation takes only " + strings.Join(oi.params, ", "))
}

// checkQueryLengths refuses a query parameter outside its spec's length bounds.
func checkQueryLengths(oi *opInfo, q url.Values) error {
	if oi == nil || len(oi.query) == 0 {
		return nil
	}
	// The first parameter out of bounds in byte order of names, so that the same
	// request always gets the same message (a map's order is random).
	var first error
	firstName := ""
	for name, vals := range q {
		b, ok := oi.query[name]
		if !ok || first != nil && name >= firstName {
			continue
		}
		for _, v := range vals {
			n := utf8.RuneCountInString(v)
			switch {
			case b.max >= 0 && n > b.max:
				first = badParam(fmt.Sprintf("the query parameter %s is %d characters long; at most %d are allowed", name, n, b.max))
			case n < b.min && b.min == 1:
				first = badParam(fmt.Sprintf("the query parameter %s must not be empty", name))
			case n < b.min:
				first = badParam(fmt.Sprintf("the query parameter %s must be at least %d characters long", name, b.min))
			default:
				continue
			}
			firstName = name
			break
		}
	}
	return first
}

// statusWriter records what a request was answered, for its metrics and its log line:
// the status, and for an error answer (writeError) its code and the error.
type statusWriter struct {
	http.ResponseWriter
	status int
	code   apigen.ErrorCode
	err    error
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// statusLabels are the metric labels of the status codes 100 to 599.
var statusLabels = func() (l [500]string) {
	for i := range l {
		l[i] = strconv.Itoa(100 + i)
	}
	return l
}()

// statusLabel is code as a metric label, without an allocation for a valid code.
func statusLabel(code int) string {
	if code >= 100 && code < 600 {
		return statusLabels[code-100]
	}
	return strconv.Itoa(code)
}

// Header values every answer (or every JSON answer) carries, one slice each for all of
// them: nothing appends to or writes into a header's values in place (Header.Add
// would copy these, their capacity being their length), and Header.Set replaces them.
var (
	hdrJSON    = []string{"application/json"}
	hdrNoStore = []string{"no-store"}
	hdrNoSniff = []string{"nosniff"}
)

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	// Every answer, errors included, names its request; every log line about the
	// request carries the same id (reqid.Handler reads it from the context).
	id := r.Header.Get(reqid.Header)
	if !reqid.Sane(id) {
		id = reqid.New()
	}
	h := w.Header()
	h.Set(reqid.Header, id)
	// Answers carry messages, users and settings that only their caller may see: no
	// browser or proxy keeps a copy, and none reads a JSON answer as anything else.
	h["Cache-Control"] = hdrNoStore
	h["X-Content-Type-Options"] = hdrNoSniff
	r = r.WithContext(reqid.With(r.Context(), id))
	sw := &statusWriter{ResponseWriter: w}
	_, pattern := s.mux.Handler(r)
	oi := s.ops[pattern]
	opName := "unknown"
	if oi != nil {
		opName = oi.id
	}
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.ErrorContext(r.Context(), "handler panicked", "op", opName, "panic", v, "stack", string(debug.Stack()))
			if sw.status == 0 {
				writeError(sw, newErr(http.StatusInternalServerError, apigen.ErrorCodeInternal, "the broker hit a bug handling this request; please report it with the broker's log"))
			}
		}
		if s.metrics != nil {
			s.metrics.HTTPRequests.WithLabelValues(opName, statusLabel(sw.status)).Inc()
			if oi != nil {
				oi.duration.Observe(time.Since(start).Seconds())
			} else {
				s.metrics.HTTPDuration.WithLabelValues(opName).Observe(time.Since(start).Seconds())
			}
		}
		s.logOutcome(r, opName, sw, start)
	}()
	if s.authOn() && !s.public(oi) {
		// A forged cross-site request is refused before it costs a password check.
		if err := checkCrossSite(r, oi); err != nil {
			writeError(sw, err)
			return
		}
		// Authentication comes before routing and before the body is read.
		u, err := s.authn.authenticate(r)
		if err != nil {
			writeError(sw, err)
			return
		}
		ctx := context.WithValue(r.Context(), principalKey{}, u)
		if u != nil {
			ctx = broker.WithPrincipal(ctx, u.Name)
		}
		r = r.WithContext(ctx)
		if oi != nil && oi.id == "metrics" && !u.IsAdmin() {
			writeError(sw, mustBeAdmin(u))
			return
		}
	} else if !s.authOn() {
		if err := s.checkBrowser(r, oi); err != nil {
			writeError(sw, err)
			return
		}
	}
	if oi != nil && oi.id == "metrics" && s.promHandler != nil {
		s.promHandler.ServeHTTP(sw, r)
		return
	}
	if r.Method == http.MethodHead && oi != nil && (oi.id == "consume" || oi.id == "consumeBatch") {
		// net/http routes a HEAD to the GET route and drops the answer's body: a HEAD
		// of a consume (a link checker, a monitor probing the URL) leased messages and
		// showed none, each back only after its visibility timeout.
		sw.Header().Set("Allow", http.MethodGet)
		writeError(sw, newErr(http.StatusMethodNotAllowed, apigen.ErrorCodeMethodNotAllowed, "HEAD is not allowed on "+clip(r.URL.Path, 256)+
			": a consume leases the messages it answers, and a HEAD answer has no body to carry them; use GET"))
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		// The generated binder would silently drop a malformed pair (wait=%zz).
		writeError(sw, badParam("the query string is malformed: "+err.Error()))
		return
	}
	if err := checkQueryNames(oi, q); err != nil {
		writeError(sw, err)
		return
	}
	if err := checkQueryLengths(oi, q); err != nil {
		writeError(sw, err)
		return
	}
	if p := r.URL.Path; p != "/" && path.Clean(p) != p {
		// Refuse rather than redirect (net/http would answer 307): a client that sends
		// /v1/topics/a/../b has a bug, and a redirect could move a write elsewhere.
		writeError(sw, newErr(http.StatusNotFound, apigen.ErrorCodeNotFound, "the path "+p+" is not in canonical form (no ., .., // or trailing /)"))
		return
	}
	n := s.bodies.need(r, oi)
	if !s.bodies.take(n) {
		writeError(sw, s.bodies.overloaded())
		return
	}
	defer s.bodies.give(n)
	if err := s.prepareBody(r, oi); err != nil {
		writeError(sw, err)
		return
	}
	if oi != nil && s.serveDirect(sw, r, oi.id, q) {
		return
	}
	s.mux.ServeHTTP(sw, r)
}

// logOutcome writes the one line of a request that was not served: "request failed"
// (WARN) for a fault (500, storage_failed, maybe_stored, disk_full, timeout), every one of them;
// "request refused" (INFO) for any other 4xx or 503, and "request dropped" (INFO) for
// a client that went away before its answer (499), both at most failLogBurst per
// failLogWindow so that a client sending garbage in a loop cannot flood the log (the
// next line written says how many were left out). A 401 has its own rate-limited line
// from the authenticator, with the user and client address.
func (s *server) logOutcome(r *http.Request, op string, sw *statusWriter, start time.Time) {
	if sw.status < 400 || sw.status == http.StatusUnauthorized {
		return
	}
	args := []any{"op", op, "method", r.Method, "path", clip(r.URL.Path, 256), "status", sw.status}
	if sw.code != "" {
		args = append(args, "code", sw.code)
	}
	if sw.err != nil {
		args = append(args, "err", sw.err)
	}
	args = append(args, "client", clientAddr(r), "ms", time.Since(start).Milliseconds())
	if isFault(sw.code, sw.status) {
		s.log.WarnContext(r.Context(), "request failed", args...)
		return
	}
	s.refusedMu.Lock()
	ok, left := s.refusedLogs.allow(time.Now())
	s.refusedMu.Unlock()
	if !ok {
		return
	}
	if left > 0 {
		args = append(args, "unlogged_since_last", left)
	}
	msg := "request refused"
	if sw.status == 499 {
		msg = "request dropped: the client went away before the answer"
	}
	s.log.InfoContext(r.Context(), msg, args...)
}

// clientAddr is the client's IP address, without the port.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// public reports whether an operation needs no credentials even with security on.
func (s *server) public(oi *opInfo) bool {
	if oi == nil {
		return false
	}
	switch oi.id {
	case "healthz", "readyz":
		return true
	case "metrics":
		return !s.protectMetrics
	}
	return false
}

// prepareBody caps the body's size and, for JSON bodies, checks them against the spec
// (unknown fields, types, ranges, required fields) before the handler sees them, so a
// bad request never changes state.
func (s *server) prepareBody(r *http.Request, oi *opInfo) error {
	if r.Body == nil || r.Body == http.NoBody {
		if oi != nil && oi.body != nil && oi.body.Required {
			return emptyBody()
		}
		return nil
	}
	limit := bodyLimit(oi)
	if oi != nil && oi.id == "produce" && r.ContentLength > MaxPayloadBytes {
		return tooLarge()
	}
	if r.ContentLength > limit {
		return newErr(http.StatusRequestEntityTooLarge, apigen.ErrorCodePayloadTooLarge, "the body is "+strconv.FormatInt(r.ContentLength, 10)+" bytes; the limit for this operation is "+strconv.FormatInt(limit, 10))
	}
	r.Body = http.MaxBytesReader(nil, r.Body, limit)
	if oi != nil && oi.id == "produce" {
		// The payload is read here, into one buffer of its Content-Length, and handed
		// to the handler as read (readPayload).
		data, err := readBody(r.Body, r.ContentLength)
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return tooLarge()
			}
			return newErr(http.StatusBadRequest, apigen.ErrorCodeBadRequest, "reading the body failed: "+err.Error())
		}
		if len(data) > MaxPayloadBytes {
			return tooLarge()
		}
		r.Body = &payloadBody{data: data}
		return nil
	}
	if oi == nil || oi.body == nil {
		return nil
	}
	data, err := readBody(r.Body, r.ContentLength)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return newErr(http.StatusRequestEntityTooLarge, apigen.ErrorCodePayloadTooLarge, "the body is over the limit of "+strconv.FormatInt(limit, 10)+" bytes for this operation")
		}
		return newErr(http.StatusBadRequest, apigen.ErrorCodeBadRequest, "reading the body failed: "+err.Error())
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	// The batch bodies: the common shape by the fast path, anything else (and every
	// refusal) by the strict decoder (fastdecode.go).
	var decoded any
	switch oi.id {
	case "produceBatch":
		decoded, err = decodeBatch(data, fastProduceBatch)
	case "ackBatch":
		decoded, err = decodeBatch(data, fastAckBatch)
	}
	if err != nil {
		return err
	}
	if decoded != nil {
		if ab, ok := decoded.(*apigen.AckBatchRequest); ok {
			if err := checkAckBatchLengths(ab); err != nil {
				return err
			}
		}
		// The route takes the decoded body from the context (decodedOnce).
		*r = *r.WithContext(context.WithValue(r.Context(), decodedBodyKey{}, decoded))
		return nil
	}
	if !utf8.Valid(data) {
		// encoding/json would replace each bad byte with U+FFFD and store the result.
		return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidJson, "the body is not valid UTF-8 (byte "+strconv.Itoa(invalidUTF8At(data))+"); JSON text must be UTF-8, so send strings as UTF-8")
	}
	if err := checkJSONShape(data); err != nil {
		return err
	}
	// Validate as JSON whatever Content-Type was sent: curl -d sends a form type.
	vr := r.Clone(r.Context())
	vr.Header.Set("Content-Type", "application/json")
	vr.Body = io.NopCloser(bytes.NewReader(data))
	in := &openapi3filter.RequestValidationInput{Request: vr, Options: &openapi3filter.Options{MultiError: false}}
	if err := openapi3filter.ValidateRequestBody(r.Context(), in, oi.body); err != nil {
		if e := nameError(oi.id, err); e != nil {
			return e
		}
		return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidJson, unsupportedHint(oi.id, describeSchemaError(err)))
	}
	return nil
}

// fixedAtCreate are the members of a topic's create that an alter does not take, and
// why.
var fixedAtCreate = map[string]string{
	"name":            "a topic is not renamed; create one of the new name",
	"partitions":      "a topic's partition count is fixed when it is created; create a topic with more partitions",
	"parent":          "a child is attached to its parent with POST /v1/topics/{parent}/children and detached with DELETE /v1/topics/{parent}/children/{child}",
	"fanout_delay_ms": "a delay child's delay is set when it is attached to its parent (POST /v1/topics/{parent}/children)",
}

// unsupportedHint adds to the schema's "property X is unsupported" what to do: why an
// alter does not take a member of the create, or where the members are listed.
func unsupportedHint(op, msg string) string {
	if !strings.HasSuffix(msg, " is unsupported") {
		return msg
	}
	if op == "alterTopic" {
		for name, why := range fixedAtCreate {
			if strings.Contains(msg, `property "`+name+`" is unsupported`) {
				return msg + ": " + why
			}
		}
	}
	return msg + "; openapi.yaml lists the members this operation takes"
}

// nameError answers a topic or user name that the schema's length bounds refuse as the
// broker answers one its naming rules refuse (invalid_name, with the rules), so that a
// name too long is not invalid_json while a name with a bad character is invalid_name.
// nil for any other validation error (a name that is not a string stays invalid_json).
func nameError(op string, err error) *apiError {
	var se *openapi3.SchemaError
	if !errors.As(err, &se) || (se.SchemaField != "minLength" && se.SchemaField != "maxLength") {
		return nil
	}
	field := strings.Join(se.JSONPointer(), ".")
	switch {
	case op == "createTopic" && field == "name":
		return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidName, "a topic name is invalid: "+broker.TopicNameRule)
	case op == "createUser" && field == "username":
		return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidName, "a username is invalid: "+broker.UsernameRule)
	}
	return nil
}

// readBody reads a whole body. With a Content-Length (already checked against the
// limit; net/http never delivers more) its buffer grows by doubling up to that length,
// instead of io.ReadAll's many small steps (nearly half of produce-batch's allocated
// bytes). It never allocates ahead of the bytes that arrived by more than double: a
// client that announces 8 MiB and sends nothing holds 64 KiB, not 8 MiB.
func readBody(body io.Reader, length int64) ([]byte, error) {
	if length <= 0 {
		return io.ReadAll(body)
	}
	buf := make([]byte, 0, min(length, 64<<10))
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= length {
				return buf, nil
			}
			buf = slices.Grow(buf, int(min(length, 2*int64(cap(buf))))-len(buf))
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// describeSchemaError turns a kin-openapi validation error into one readable sentence.
func describeSchemaError(err error) string {
	var se *openapi3.SchemaError
	if errors.As(err, &se) {
		field := strings.Join(se.JSONPointer(), ".")
		if field == "" {
			return "the body does not match the API: " + se.Reason
		}
		return "field " + field + ": " + se.Reason
	}
	var re *openapi3filter.RequestError
	if errors.As(err, &re) && re.Err != nil {
		return "the body does not match the API: " + re.Err.Error()
	}
	return "the body does not match the API: " + err.Error()
}

// invalidUTF8At returns the offset of the first byte that is not valid UTF-8 in b.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// strictDecode decodes a batch body in one pass with the JSON v2 decoder (the basis of
// encoding/json/v2, several times faster than encoding/json here): exactly one value,
// member names matched exactly, unknown members, repeated names and trailing data
// refused. Invalid UTF-8 inside strings is let through (as U+FFFD, or raw inside a
// payload) so the handler can answer invalid_payload for it, as for a single produce.
// A null where the spec wants a string, an integer, a boolean or an object (key,
// partition, payload_encoding, extend, timestamp, origin, incarnation, validate_only)
// is refused too: the decoder would take it as absent.
func strictDecode(data []byte, v any) error {
	if err := jsonv2.Unmarshal(data, v, jsonv2.RejectUnknownMembers(true), jsontext.AllowInvalidUTF8(true), refuseNulls); err != nil {
		var se *jsonv2.SemanticError
		if errors.As(err, &se) && errors.Is(err, errNull) {
			return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidJson, "the body is not valid for this operation: "+string(se.JSONPointer)+" is null; leave the member out instead")
		}
		return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidJson, jsonBodyError(err))
	}
	return nil
}

// emptyBody answers a request without the JSON body its operation requires.
func emptyBody() *apiError {
	return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidJson, "the body is empty; this operation takes a JSON object (openapi.yaml lists its members)")
}

// jsonBodyError says what is wrong with a batch body the decoder refused, in the
// API's terms: the member (as a JSON pointer) and what it takes, in place of the
// decoder's words, which named Go types ("cannot unmarshal JSON string into Go
// apigen.OutgoingMessage").
func jsonBodyError(err error) string {
	var se *jsonv2.SemanticError
	var syn *jsontext.SyntacticError
	switch {
	case errors.As(err, &se) && errors.Is(err, jsonv2.ErrUnknownName):
		ptr := string(se.JSONPointer)
		parent, name := "the body", ptr
		if i := strings.LastIndexByte(ptr, '/'); i >= 0 {
			if i > 0 {
				parent = ptr[:i]
			}
			name = strings.NewReplacer("~1", "/", "~0", "~").Replace(ptr[i+1:])
		}
		return fmt.Sprintf("the body is not valid for this operation: %s has no member %q; openapi.yaml lists the members it takes", parent, name)
	case errors.As(err, &se):
		at := string(se.JSONPointer)
		if at == "" {
			at = "the body"
		}
		switch {
		case se.Err != nil && strings.Contains(se.Err.Error(), "out of range"):
			return fmt.Sprintf("the body is not valid for this operation: %s is out of range; openapi.yaml gives the values it takes", at)
		case se.Err == nil && se.GoType != nil:
			return fmt.Sprintf("the body is not valid for this operation: %s must be %s, not %s", at, jsonKindOfGo(se.GoType), jsonKindName(se.JSONKind))
		case errors.Is(se.Err, strconv.ErrSyntax) && se.GoType != nil && len(se.JSONValue) > 0:
			return fmt.Sprintf("the body is not valid for this operation: %s must be %s, not %s", at, jsonKindOfGo(se.GoType), se.JSONValue)
		case se.Err != nil:
			return fmt.Sprintf("the body is not valid for this operation: %s: %v", at, se.Err)
		}
	case errors.As(err, &syn) && errors.Is(err, io.ErrUnexpectedEOF) && syn.ByteOffset == 0:
		return emptyBody().msg
	case errors.As(err, &syn):
		return "the body is not valid JSON: " + strings.TrimPrefix(err.Error(), "jsontext: ")
	}
	return "the body is not valid for this operation: " + err.Error()
}

// jsonKindOfGo is the JSON a member of Go type t takes, as the API's errors name it.
func jsonKindOfGo(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "another JSON value"
}

// jsonKindName names a JSON value's kind as the API's errors do.
func jsonKindName(k jsontext.Kind) string {
	switch k {
	case '"':
		return "a string"
	case '0':
		return "a number"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "true or false"
	case 'n':
		return "null"
	}
	return "this value"
}

// checkAckBatchLengths refuses, whole, an ack-batch with a member outside the spec's
// length bounds, as for any other member the spec forbids: a receipt handle of 1 to 512
// characters, an extend of at most 32.
func checkAckBatchLengths(req *apigen.AckBatchRequest) error {
	for i, a := range req.Acks {
		if n := utf8.RuneCountInString(a.ReceiptHandle); n < 1 || n > maxHandleChars {
			return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidJson, fmt.Sprintf("the body is not valid for this operation: /acks/%d/receipt_handle is %d characters long; pass the receipt_handle as received (1 to %d)", i, n, maxHandleChars))
		}
		if a.Extend != nil {
			if n := utf8.RuneCountInString(*a.Extend); n > maxExtendChars {
				return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidJson, fmt.Sprintf("the body is not valid for this operation: /acks/%d/extend is %d characters long; at most %d: true, 0 or a duration like 45s", i, n, maxExtendChars))
			}
		}
	}
	return nil
}

// maxHandleChars is the spec's maxLength of a receipt handle.
const maxHandleChars = 512

// errNull is why strictDecode refuses a null member.
var errNull = errors.New("null is not a value of this member")

// refuseNulls makes the decoder refuse null for the optional members of the batch
// bodies, each a pointer in the generated types (payload stays any JSON value, null
// included).
var refuseNulls = jsonv2.WithUnmarshalers(jsonv2.JoinUnmarshalers(
	jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, _ **string) error { return refuseNull(dec) }),
	jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, _ **int32) error { return refuseNull(dec) }),
	jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, _ **apigen.OutgoingMessagePayloadEncoding) error { return refuseNull(dec) }),
	jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, _ **bool) error { return refuseNull(dec) }),
	jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, _ **int64) error { return refuseNull(dec) }),
	jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, _ **apigen.MessageOrigin) error { return refuseNull(dec) }),
))

func refuseNull(dec *jsontext.Decoder) error {
	if dec.PeekKind() == 'n' {
		return errNull
	}
	return jsonv2.SkipFunc
}

// maxBodyDepth is the deepest nesting of a JSON request body's arrays and objects
// (payloads inside it have their own bound, MaxPayloadDepth).
const maxBodyDepth = 64

// checkJSONShape refuses bodies that are not exactly one JSON value, nest deeper than
// maxBodyDepth levels, or repeat a key in an object (which parsers resolve differently).
func checkJSONShape(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		keys     map[string]bool
		isObject bool
		wantKey  bool
	}
	var stack []frame
	invalid := func(msg string) error { return newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidJson, msg) }
	for {
		tok, err := dec.Token()
		if err == io.EOF && len(bytes.TrimSpace(data)) == 0 {
			return emptyBody()
		}
		if err == io.EOF {
			return invalid("the body ends before its JSON value is complete")
		}
		if err != nil {
			return invalid("the body is not valid JSON: " + err.Error())
		}
		top := len(stack) - 1
		isKey := false
		switch t := tok.(type) {
		case json.Delim:
			if t == '{' || t == '[' {
				if len(stack) >= maxBodyDepth {
					return invalid("the body nests deeper than " + strconv.Itoa(maxBodyDepth) + " levels")
				}
				stack = append(stack, frame{keys: map[string]bool{}, isObject: t == '{', wantKey: t == '{'})
				continue
			}
			stack = stack[:top]
			top--
		case string:
			if top >= 0 && stack[top].isObject && stack[top].wantKey {
				if stack[top].keys[t] {
					return invalid("the key " + strconv.Quote(t) + " appears twice in one object")
				}
				stack[top].keys[t] = true
				stack[top].wantKey = false
				isKey = true
			}
		}
		if !isKey && top >= 0 && stack[top].isObject {
			stack[top].wantKey = true // a value ended: the next string is a key
		}
		if len(stack) == 0 {
			if _, err := dec.Token(); err != io.EOF {
				return invalid("the body holds more than one JSON value, or trailing garbage")
			}
			return nil
		}
	}
}

// noRoute answers paths no operation matches: 405 when the path exists with another
// method, 404 otherwise, both with the JSON error body.
func (s *server) noRoute(w http.ResponseWriter, r *http.Request) {
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(context.Background())
		probe.Method = m
		if _, p := s.mux.Handler(probe); p != "/" && p != "" {
			allowed = append(allowed, m)
		}
	}
	if len(allowed) > 0 {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeError(w, newErr(http.StatusMethodNotAllowed, apigen.ErrorCodeMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path+"; use "+strings.Join(allowed, " or ")))
		return
	}
	writeError(w, newErr(http.StatusNotFound, apigen.ErrorCodeNotFound, "no route "+r.Method+" "+r.URL.Path+"; the API lives under /v1 (see openapi.yaml)"))
}
