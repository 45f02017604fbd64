package testutil

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

func mustValidator(t *testing.T) *OpenAPIValidator {
	t.Helper()
	v, err := LoadOpenAPIValidator()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestValidatorResponses(t *testing.T) {
	v := mustValidator(t)
	const js = "application/json"
	errBody := `{"error":{"code":"topic_not_found","message":"no such topic"}}`
	topic := `{"name":"t","incarnation":"1","partitions":1,"retention_ms":1000,"visibility_timeout_ms":100,` +
		`"max_in_flight_per_partition":1,"max_acked_ahead_per_partition":1,"replication_factor":1,"created_at":"2026-01-02T03:04:05Z"}`
	for _, c := range []struct {
		name         string
		method, path string
		status       int
		ctype, body  string
		hdr          []string
		ok           bool
	}{
		{"health", "GET", "/healthz", 200, js, `{"status":"ok"}`, nil, true},
		{"health without status", "GET", "/healthz", 200, js, `{}`, nil, false},
		{"undeclared status", "GET", "/healthz", 500, js, errBody, nil, false},
		{"created topic", "POST", "/v1/topics", 201, js, topic, nil, true},
		{"topic missing a field", "POST", "/v1/topics", 201, js, `{"name":"t"}`, nil, false},
		{"topic with a bad date", "POST", "/v1/topics", 201, js, strings.Replace(topic, "2026-01-02T03:04:05Z", "yesterday", 1), nil, false},
		{"error body", "GET", "/v1/topics/t", 404, js, errBody, nil, true},
		{"escaped topic name", "GET", "/v1/topics/a%2Fb", 400, js, `{"error":{"code":"invalid_name","message":"bad"}}`, nil, true},
		{"error code not in the enum", "GET", "/v1/topics/t", 404, js, `{"error":{"code":"nope","message":"x"}}`, nil, false},
		{"error with an extra field", "GET", "/v1/topics/t", 404, js, `{"error":{"code":"topic_not_found","message":"x","extra":1}}`, nil, false},
		{"error as text", "GET", "/v1/topics/t", 404, "text/plain", "not found", nil, false},
		{"consume 204", "GET", "/v1/topics/t/consume", 204, "", "", nil, true},
		{"204 with a body", "POST", "/v1/topics/t/ack", 204, js, `{}`, nil, false},
		{"503 with Retry-After", "POST", "/v1/topics/t/ack", 503, js, `{"error":{"code":"acked_ahead_full","message":"x"}}`, []string{"Retry-After", "1"}, true},
		{"503 without Retry-After", "POST", "/v1/topics/t/ack", 503, js, `{"error":{"code":"acked_ahead_full","message":"x"}}`, nil, false},
		{"503 with a bad Retry-After", "POST", "/v1/topics/t/ack", 503, js, `{"error":{"code":"acked_ahead_full","message":"x"}}`, []string{"Retry-After", "soon"}, false},
		{"message", "GET", "/v1/topics/t/consume", 200, js, `{"topic":"t","partition":0,"offset":3,"key":null,"payload":{"a":1},"timestamp":5}`, nil, true},
		{"message with invalid UTF-8", "GET", "/v1/topics/t/consume", 200, js, "{\"topic\":\"t\",\"partition\":0,\"offset\":3,\"key\":null,\"payload\":\"\xff\",\"timestamp\":5}", nil, false},
		{"message without offset", "GET", "/v1/topics/t/consume", 200, js, `{"topic":"t","partition":0,"key":null,"payload":{"a":1},"timestamp":5}`, nil, false},
		{"metrics text", "GET", "/metrics", 200, "text/plain; version=0.0.4; charset=utf-8", "# HELP x y\nx 1\n", nil, true},
		{"unknown route 404", "GET", "/v2/nothing", 404, js, `{"error":{"code":"not_found","message":"no route"}}`, nil, true},
		{"unknown route 404 not JSON", "GET", "/v2/nothing", 404, "text/plain", "404 page not found", nil, false},
		{"unknown route 200", "GET", "/v2/nothing", 200, js, `{}`, nil, false},
		{"wrong method 405", "PUT", "/v1/topics", 405, js, `{"error":{"code":"method_not_allowed","message":"use GET"}}`, nil, true},
		{"wrong method 404", "PUT", "/v1/topics", 404, js, `{"error":{"code":"not_found","message":"x"}}`, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest(c.method, "http://127.0.0.1:1"+c.path, nil)
			h := http.Header{}
			if c.ctype != "" {
				h.Set("Content-Type", c.ctype)
			}
			for i := 0; i < len(c.hdr); i += 2 {
				h.Set(c.hdr[i], c.hdr[i+1])
			}
			err := v.ValidateResponse(req, c.status, h, []byte(c.body))
			if (err == nil) != c.ok {
				t.Errorf("ValidateResponse = %v, want ok=%v", err, c.ok)
			}
		})
	}
}

func TestValidatorRouting(t *testing.T) {
	v := mustValidator(t)
	for _, c := range []struct {
		path, tmpl string
		params     map[string]string
	}{
		{"/v1/cluster/members", "/v1/cluster/members", nil},
		{"/v1/cluster/members/n1", "/v1/cluster/members/{node}", map[string]string{"node": "n1"}},
		{"/v1/topics/a%2Fb/produce", "/v1/topics/{topic}/produce", map[string]string{"topic": "a/b"}},
		{"/v1/topics/t/partitions/7/messages", "/v1/topics/{topic}/partitions/{partition}/messages", map[string]string{"topic": "t", "partition": "7"}},
		{"/v1/topics/", "", nil},
		{"/v1/topics/t/partitions/0", "", nil},
	} {
		r, params := v.match(c.path)
		got := ""
		if r != nil {
			got = r.template
		}
		if got != c.tmpl {
			t.Errorf("%s matched %q, want %q", c.path, got, c.tmpl)
			continue
		}
		for k, want := range c.params {
			if params[k] != want {
				t.Errorf("%s: param %s = %q, want %q", c.path, k, params[k], want)
			}
		}
	}
}

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func TestClientReportsMismatches(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"status":"ok"}`)
		case "/readyz":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTeapot)
			fmt.Fprint(w, `{"status":"ok"}`)
		default:
			http.NotFound(w, r) // a text/plain 404: not the JSON error body
		}
	}))
	defer srv.Close()
	rec := &recorder{TB: t}
	c := NewClient(rec, srv.URL)
	if r := c.Get("/healthz"); r.Status != 200 || len(rec.errs) != 0 {
		t.Fatalf("conforming response: status %d, errors %v", r.Status, rec.errs)
	}
	c.Get("/readyz")
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "GET /readyz -> 418") {
		t.Errorf("an undeclared status was reported as %q", rec.errs)
	}
	rec.errs = nil
	c.Get("/v1/nothing")
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "404") {
		t.Errorf("a non-JSON 404 was reported as %q", rec.errs)
	}
}

func TestParseError(t *testing.T) {
	for _, c := range []struct {
		body string
		ok   bool
	}{
		{`{"error":{"code":"a","message":"b"}}`, true},
		{`{"error":{"code":"a","message":"b"}}` + "\n", true},
		{`{"error":{"code":"a"}}`, false},
		{`{"error":{"code":"","message":"b"}}`, false},
		{`{"error":{"code":"a","message":"b"},"x":1}`, false},
		{`{"error":"a"}`, false},
		{`{"error":{"code":"a","message":"b"}}{}`, false},
		{`not json`, false},
	} {
		if _, _, err := ParseError([]byte(c.body)); (err == nil) != c.ok {
			t.Errorf("ParseError(%s) = %v, want ok=%v", c.body, err, c.ok)
		}
	}
}

// TestSpecIsValid: openapi.yaml must be a valid OpenAPI document, or the response
// checks rest on a misread spec (a YAML flow mapping with a comma in a description
// once split into two keys).
func TestSpecIsValid(t *testing.T) {
	if err := mustValidator(t).SpecError(); err != nil {
		t.Error(err)
	}
}
