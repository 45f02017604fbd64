package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestParameterErrorsSayWhatToSend: a parameter the generated router could not bind
// was refused in the binder's words ("Query argument receipt_handle is required, but
// not found", "error binding string parameter: strconv.ParseInt: parsing \"abc\":
// invalid syntax"), which say how Go failed, not what to send. Each now names the
// parameter and what it takes.
func TestParameterErrorsSayWhatToSend(t *testing.T) {
	t.Parallel()
	h, err := New(&recordingBroker{}, Options{Logger: quietLogger(), AllowedHosts: []string{"example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, target, want string }{
		{http.MethodPost, "/v1/topics/t/ack", "the query parameter receipt_handle is required: add ?receipt_handle=… to the URL"},
		{http.MethodPost, "/v1/topics/t/ack?receipt_handle=", "the query parameter receipt_handle must not be empty"},
		{http.MethodPost, "/v1/topics/t/produce?partition=abc", `the parameter partition must be a whole number, not \"abc\"`},
		{http.MethodPost, "/v1/topics/t/produce?partition=1&partition=0", "the parameter partition was given more than once; give it once"},
		{http.MethodGet, "/v1/topics/t/partitions/zz/messages", `the parameter partition must be a whole number, not \"zz\"`},
		{http.MethodGet, "/v1/topics/t/partitions/99999999999/messages", "the parameter partition is out of range"},
		{http.MethodGet, "/v1/topics/t/consume-batch?max=ten", `the parameter max must be a whole number, not \"ten\"`},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(c.method, c.target, strings.NewReader("x")))
		body := rec.Body.String()
		if rec.Code != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_parameter"`) || !strings.Contains(body, c.want) {
			t.Errorf("%s %s: %d %s; want 400 invalid_parameter saying %q", c.method, c.target, rec.Code, body, c.want)
		}
		for _, inside := range []string{"strconv", "binding", "Query argument", "but not found", "Invalid format"} {
			if strings.Contains(body, inside) {
				t.Errorf("%s %s: the answer shows the binder's words %q: %s", c.method, c.target, inside, body)
			}
		}
	}
}
