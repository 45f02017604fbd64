package console

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHandler: the console's files are served under /console with their types and a
// strict content security policy; everything else reaches the API untouched.
func TestHandler(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-From", "api")
		w.WriteHeader(http.StatusTeapot)
	})
	h := Handler(api)
	for _, tc := range []struct {
		method, path string
		status       int
		ctype, body  string
		fromAPI      bool
	}{
		{"GET", "/console", 200, "text/html; charset=utf-8", `src="/console/app.js"`, false},
		{"GET", "/console/", 200, "text/html; charset=utf-8", `href="/console/app.css"`, false},
		{"GET", "/console/app.js", 200, "text/javascript; charset=utf-8", "", false},
		{"GET", "/console/app.css", 200, "text/css; charset=utf-8", "", false},
		{"HEAD", "/console/app.js", 200, "text/javascript; charset=utf-8", "", false},
		{"GET", "/console/nope.js", 404, "", "", false},
		{"GET", "/console/../v1/topics", 404, "", "", false},
		{"POST", "/console", 405, "", "", false},
		{"GET", "/consoles", http.StatusTeapot, "", "", true},
		{"GET", "/v1/topics", http.StatusTeapot, "", "", true},
	} {
		req := httptest.NewRequest(tc.method, "http://127.0.0.1"+tc.path, nil)
		req.URL.Path = tc.path // keep a path NewRequest would clean
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		res := rec.Result()
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != tc.status {
			t.Errorf("%s %s: status %d, want %d", tc.method, tc.path, res.StatusCode, tc.status)
			continue
		}
		if (res.Header.Get("X-From") == "api") != tc.fromAPI {
			t.Errorf("%s %s: answered by the API: %v, want %v", tc.method, tc.path, !tc.fromAPI, tc.fromAPI)
		}
		if tc.status != 200 {
			continue
		}
		if got := res.Header.Get("Content-Type"); got != tc.ctype {
			t.Errorf("%s %s: Content-Type %q, want %q", tc.method, tc.path, got, tc.ctype)
		}
		if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s %s: Content-Security-Policy %q", tc.method, tc.path, csp)
		}
		if tc.method == "GET" && len(body) == 0 {
			t.Errorf("%s %s: empty body", tc.method, tc.path)
		}
		if !strings.Contains(string(body), tc.body) {
			t.Errorf("%s %s: body lacks %q", tc.method, tc.path, tc.body)
		}
	}
}
