package httpapi

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAnswersAreNotStoredNorSniffed: every answer of the API, a served request's and a
// refusal's, tells browsers and proxies to keep no copy (it may carry messages, users,
// settings) and not to read it as anything but its content type.
func TestAnswersAreNotStoredNorSniffed(t *testing.T) {
	t.Parallel()
	h, err := New(benchBroker{}, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AllowedHosts: []string{"example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/healthz", ""},
		{"GET", "/v1/topics/t", ""},
		{"POST", "/v1/topics/t/produce", `{"a":1}`},
		{"POST", "/v1/topics/t/produce", `{`},
		{"GET", "/nowhere", ""},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
		if c.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		h.ServeHTTP(rec, req)
		if cc, ns := rec.Header().Get("Cache-Control"), rec.Header().Get("X-Content-Type-Options"); cc != "no-store" || ns != "nosniff" {
			t.Errorf("%s %s answered %d with Cache-Control %q, X-Content-Type-Options %q; want no-store and nosniff", c.method, c.path, rec.Code, cc, ns)
		}
	}
}
