package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// getPlain fetches a path outside the API, so not through the spec-validating client.
func getPlain(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// TestConsoleServed: the broker serves the console's page and files at /console without
// credentials (they hold no data) while the API behind it still asks for them, and
// --console=false leaves /console to the API, which answers 404.
func TestConsoleServed(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t)
	if status, body := getPlain(t, n.URL()+"/console"); status != http.StatusOK || !strings.Contains(body, `src="/console/app.js"`) {
		t.Errorf("/console: %d %.200s", status, body)
	}
	for _, p := range []string{"/console/app.js", "/console/app.css"} {
		if status, body := getPlain(t, n.URL()+p); status != http.StatusOK || len(body) < 100 {
			t.Errorf("%s: %d, %d bytes", p, status, len(body))
		}
	}
	a.Get("/v1/topics").Expect(t, http.StatusOK)

	_, off := startBroker(t, "--console=false")
	off.Get("/console").ExpectError(t, http.StatusNotFound, "not_found")
	off.Get("/console/app.js").ExpectError(t, http.StatusNotFound, "not_found")
}
