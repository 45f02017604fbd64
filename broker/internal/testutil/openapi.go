package testutil

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
)

// OpenAPIValidator checks HTTP responses against openapi.yaml: the status must be one
// the operation declares, and headers and body must match their schemas. Requests are
// never validated: tests send bad input on purpose.
//
// Routing is done here rather than with a kin-openapi router because those match on
// the decoded path, so a topic named "a%2Fb" would look like two segments; the broker
// (net/http's ServeMux) matches on the escaped path, and so does this.
type OpenAPIValidator struct {
	doc     *openapi3.T
	routes  []specRoute
	specErr error
}

// SpecError returns what kin-openapi's document validation found wrong with the spec
// itself, or nil.
func (v *OpenAPIValidator) SpecError() error { return v.specErr }

type specRoute struct {
	template string   // as in the spec: /v1/topics/{topic}
	segs     []string // template split on "/"
	literals int      // segments that are not parameters
	item     *openapi3.PathItem
}

var (
	validatorOnce sync.Once
	validator     *OpenAPIValidator
	validatorErr  error
)

// LoadOpenAPIValidator loads openapi.yaml once per test process and returns the
// shared validator.
func LoadOpenAPIValidator() (*OpenAPIValidator, error) {
	validatorOnce.Do(func() {
		path, err := SpecPath()
		if err != nil {
			validatorErr = err
			return
		}
		validator, validatorErr = NewOpenAPIValidator(path)
	})
	return validator, validatorErr
}

// NewOpenAPIValidator loads and checks the spec at path.
func NewOpenAPIValidator(path string) (*OpenAPIValidator, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("testutil: loading %s: %w", path, err)
	}
	v := &OpenAPIValidator{doc: doc}
	// A spec that kin-openapi finds invalid is still usable for checking responses
	// (its references are resolved); the problem is kept for SpecError to report, so
	// that one defect in the spec does not stop every test.
	if err := doc.Validate(context.Background()); err != nil {
		v.specErr = fmt.Errorf("%s is not a valid OpenAPI document: %w", path, err)
	}
	for tmpl, item := range doc.Paths.Map() {
		r := specRoute{template: tmpl, segs: strings.Split(tmpl, "/"), item: item}
		for _, s := range r.segs {
			if !isParam(s) {
				r.literals++
			}
		}
		v.routes = append(v.routes, r)
	}
	return v, nil
}

func isParam(seg string) bool {
	return strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}")
}

// match finds the spec path an escaped request path belongs to, preferring the
// template with the most literal segments, and returns its decoded path parameters.
func (v *OpenAPIValidator) match(escapedPath string) (*specRoute, map[string]string) {
	segs := strings.Split(escapedPath, "/")
	var best *specRoute
	var bestParams map[string]string
	for i := range v.routes {
		r := &v.routes[i]
		if len(r.segs) != len(segs) || (best != nil && r.literals <= best.literals) {
			continue
		}
		params := map[string]string{}
		ok := true
		for j, s := range r.segs {
			if isParam(s) {
				dec, err := url.PathUnescape(segs[j])
				if err != nil || segs[j] == "" {
					ok = false
					break
				}
				params[s[1:len(s)-1]] = dec
				continue
			}
			if s != segs[j] {
				ok = false
				break
			}
		}
		if ok {
			best, bestParams = r, params
		}
	}
	return best, bestParams
}

// ValidateResponse checks one response to req. It returns nil when the response
// conforms, or an error that names what does not.
func (v *OpenAPIValidator) ValidateResponse(req *http.Request, status int, header http.Header, body []byte) error {
	if status == http.StatusNoContent && len(body) > 0 {
		return fmt.Errorf("204 with a %d-byte body", len(body))
	}
	if status == http.StatusServiceUnavailable && header.Get("Retry-After") == "" {
		// The spec's prose: every 503 carries Retry-After.
		return fmt.Errorf("503 without Retry-After")
	}
	if ct := header.Get("Content-Type"); strings.HasPrefix(ct, "application/json") && !utf8.Valid(body) {
		// kin-openapi decodes with encoding/json, which quietly replaces invalid UTF-8.
		return fmt.Errorf("JSON body is not valid UTF-8 (RFC 8259 §8.1)")
	}
	r, params := v.match(req.URL.EscapedPath())
	if r == nil {
		if status != http.StatusNotFound {
			return fmt.Errorf("no spec route matches the path, so only 404 is allowed, got %d", status)
		}
		return checkErrorBody(header, body, "not_found")
	}
	op := r.item.GetOperation(req.Method)
	if op == nil {
		if status != http.StatusMethodNotAllowed {
			return fmt.Errorf("spec path %s has no %s operation, so only 405 is allowed, got %d", r.template, req.Method, status)
		}
		return checkErrorBody(header, body, "method_not_allowed")
	}
	route := &routers.Route{Spec: v.doc, Path: r.template, PathItem: r.item, Method: req.Method, Operation: op}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request:    req,
			PathParams: params,
			Route:      route,
		},
		Status:  status,
		Header:  header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		return fmt.Errorf("operation %s: %w", op.OperationID, err)
	}
	return nil
}

// checkErrorBody checks by hand that body is the JSON error shape
// {"error":{"code","message"}} with the given code.
func checkErrorBody(header http.Header, body []byte, wantCode string) error {
	if ct := header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return fmt.Errorf("error body has Content-Type %q, want application/json", ct)
	}
	code, _, err := ParseError(body)
	if err != nil {
		return err
	}
	if wantCode != "" && code != wantCode {
		return fmt.Errorf("error code %q, want %q", code, wantCode)
	}
	return nil
}

// ParseError parses the JSON error body strictly: exactly {"error":{"code","message"}}
// with non-empty strings and nothing else.
func ParseError(body []byte) (code, message string, err error) {
	var e struct {
		Error *struct {
			Code    *string `json:"code"`
			Message *string `json:"message"`
		} `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return "", "", fmt.Errorf("not the JSON error shape: %v: %q", err, truncateBytes(body, 200))
	}
	if dec.More() {
		return "", "", fmt.Errorf("JSON error body has trailing data: %q", truncateBytes(body, 200))
	}
	if e.Error == nil || e.Error.Code == nil || e.Error.Message == nil || *e.Error.Code == "" || *e.Error.Message == "" {
		return "", "", fmt.Errorf("JSON error body lacks error.code or error.message: %q", truncateBytes(body, 200))
	}
	return *e.Error.Code, *e.Error.Message, nil
}

func truncateBytes(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
