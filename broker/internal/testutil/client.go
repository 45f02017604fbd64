package testutil

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Client is a small HTTP client for tests. Every response it receives is validated
// against openapi.yaml; a mismatch fails the test with the method, path, status and
// reason. It is safe for concurrent use, including from goroutines other than the
// test's: it reports failures with t.Errorf, never t.Fatal.
type Client struct {
	t          testing.TB
	base       string
	hc         *http.Client
	v          *OpenAPIValidator
	user, pass string
	basic      bool
}

// Response is a whole HTTP response.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// NewClient returns a client for the broker at baseURL (http://127.0.0.1:PORT).
func NewClient(t testing.TB, baseURL string) *Client {
	t.Helper()
	v, err := LoadOpenAPIValidator()
	if err != nil {
		t.Fatalf("loading openapi.yaml: %v", err)
	}
	return &Client{
		t:    t,
		base: strings.TrimRight(baseURL, "/"),
		// Long polls wait up to 20 s; the bound leaves room for a loaded machine.
		hc: &http.Client{
			Timeout:       60 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		v: v,
	}
}

// WithBasicAuth returns a client that sends HTTP Basic credentials on every request.
func (c *Client) WithBasicAuth(user, password string) *Client {
	cc := *c
	cc.user, cc.pass, cc.basic = user, password, true
	return &cc
}

// BaseURL returns the broker's base URL.
func (c *Client) BaseURL() string { return c.base }

// Do sends method path (path may carry a query string, already escaped) with body
// (nil for none) and headers given as name, value pairs. A transport error fails the
// test and returns a Response with Status 0.
func (c *Client) Do(method, path string, body []byte, hdr ...string) *Response {
	c.t.Helper()
	r, err := c.Try(method, path, body, hdr...)
	if err != nil {
		c.t.Errorf("%s %s: %v", method, path, err)
		return &Response{Header: http.Header{}}
	}
	return r
}

// Try is Do for requests that may fail on purpose (a broker being killed): a
// transport error is returned, not reported. A response that arrives is still
// validated.
func (c *Client) Try(method, path string, body []byte, hdr ...string) (*Response, error) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	if len(hdr)%2 != 0 {
		return nil, fmt.Errorf("testutil: headers must come in name, value pairs")
	}
	for i := 0; i < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return c.Send(req)
}

// Send sends a prepared request (for chunked bodies and other special cases) and
// validates the response.
func (c *Client) Send(req *http.Request) (*Response, error) {
	c.t.Helper()
	if c.basic && req.Header.Get("Authorization") == "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the response body: %w", err)
	}
	r := &Response{Status: resp.StatusCode, Header: resp.Header, Body: body}
	if err := c.v.ValidateResponse(req, r.Status, r.Header, r.Body); err != nil {
		c.t.Errorf("response does not match openapi.yaml: %s %s -> %d: %v\nbody: %s",
			req.Method, req.URL.RequestURI(), r.Status, err, truncateBytes(body, 500))
	}
	return r, nil
}

// Get is Do("GET", path, nil).
func (c *Client) Get(path string) *Response {
	c.t.Helper()
	return c.Do(http.MethodGet, path, nil)
}

// PostJSON sends v (marshalled unless it is already []byte or a string) as
// application/json.
func (c *Client) PostJSON(path string, v any) *Response {
	c.t.Helper()
	return c.Do(http.MethodPost, path, jsonBody(c.t, v), "Content-Type", "application/json")
}

// PatchJSON is PostJSON with PATCH.
func (c *Client) PatchJSON(path string, v any) *Response {
	c.t.Helper()
	return c.Do(http.MethodPatch, path, jsonBody(c.t, v), "Content-Type", "application/json")
}

func jsonBody(t testing.TB, v any) []byte {
	t.Helper()
	switch b := v.(type) {
	case []byte:
		return b
	case string:
		return []byte(b)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Errorf("marshalling a request body: %v", err)
	}
	return b
}

// JSON decodes the body into v; a failure fails the test and returns false.
func (r *Response) JSON(t testing.TB, v any) bool {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Errorf("decoding response body (status %d): %v: %s", r.Status, err, truncateBytes(r.Body, 300))
		return false
	}
	return true
}

// ErrorCode returns the error.code of a JSON error body, or "" when the body is not
// one.
func (r *Response) ErrorCode() string {
	code, _, err := ParseError(r.Body)
	if err != nil {
		return ""
	}
	return code
}

// Expect fails the test unless the status is want; it returns whether it was.
func (r *Response) Expect(t testing.TB, want int) bool {
	t.Helper()
	if r.Status != want {
		t.Errorf("status %d, want %d; body: %s", r.Status, want, truncateBytes(r.Body, 300))
		return false
	}
	return true
}

// ExpectError fails the test unless the response is status with the JSON error body
// whose code is code.
func (r *Response) ExpectError(t testing.TB, status int, code string) bool {
	t.Helper()
	ok := true
	if r.Status != status {
		t.Errorf("status %d, want %d (%s); body: %s", r.Status, status, code, truncateBytes(r.Body, 300))
		ok = false
	}
	got, _, err := ParseError(r.Body)
	switch {
	case err != nil:
		t.Errorf("status %d: %v", r.Status, err)
		ok = false
	case got != code:
		t.Errorf("error code %q, want %q; body: %s", got, code, truncateBytes(r.Body, 300))
		ok = false
	}
	return ok
}
