package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestStartingAnswersHealthAndUnavailable: before the node is ready its port says the
// process lives and that everything else is not available yet, as JSON with
// Retry-After, never a hang or a refused connection.
func TestStartingAnswersHealthAndUnavailable(t *testing.T) {
	t.Parallel()
	h := Starting()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	var health struct{ Status string }
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &health) != nil || health.Status != "ok" {
		t.Fatalf("/healthz while starting: %d %s, want 200 {\"status\":\"ok\"}", w.Code, w.Body)
	}
	for _, target := range []string{"/readyz", "/v1/topics", "/v1/topics/t/produce", "/metrics"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, target, nil))
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" ||
			json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Error.Code != "unavailable" {
			t.Errorf("%s while starting: %d Retry-After %q %s, want 503 unavailable with Retry-After", target, w.Code, w.Header().Get("Retry-After"), w.Body)
		}
	}
}
