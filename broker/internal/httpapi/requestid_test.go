package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/reqid"
	"github.com/narad-mq/narad/broker/internal/testutil"
)

// failingBroker answers every produce with a storage fault, and logs a line of its own
// with the request's context, as the broker's request paths do.
type failingBroker struct {
	benchBroker
	log *slog.Logger
}

func (f failingBroker) Produce(ctx context.Context, topic string, msgs []broker.Outgoing) ([]broker.Produced, error) {
	f.log.ErrorContext(ctx, "broker line about the request")
	return nil, errors.Join(broker.ErrStorage, errors.New("eio"))
}

// TestRequestID: every answer, errors included, carries an X-Request-Id; a sane id from
// the client is kept and an insane one replaced; and every log line about a request
// (the API's own and the broker's, logged with the request's context) names it, with
// one line for the failure and one for the refusal.
func TestRequestID(t *testing.T) {
	t.Parallel()
	var logs testutil.LockedBuffer
	log := slog.New(reqid.NewHandler(slog.NewTextHandler(&logs, nil)))
	h, err := New(failingBroker{log: log}, Options{Logger: log, AllowedHosts: []string{"example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, path, body, id string) (int, string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if id != "" {
			req.Header.Set("X-Request-Id", id)
		}
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Header().Get("X-Request-Id")
	}

	code, id := do("GET", "/healthz", "", "")
	if code != 200 || len(id) != 16 {
		t.Errorf("healthz: status %d, X-Request-Id %q; want 200 and a generated 16-digit id", code, id)
	}
	if _, id2 := do("GET", "/healthz", "", ""); id2 == id {
		t.Errorf("two requests got the same id %q", id)
	}
	if code, id := do("GET", "/healthz", "", "client-id_1.x"); code != 200 || id != "client-id_1.x" {
		t.Errorf("a sane client id: got %d %q, want it kept", code, id)
	}
	for _, bad := range []string{strings.Repeat("a", 65), "has space", "semi;colon", "ünï"} {
		if _, id := do("GET", "/healthz", "", bad); id == bad || !reqid.Sane(id) {
			t.Errorf("client id %q: answered %q, want a fresh sane id", bad, id)
		}
	}

	// A fault: the broker's line and the API's "request failed" line name the id.
	code, id = do("POST", "/v1/topics/t/produce", `{"a":1}`, "fault-1")
	if code != 503 || id != "fault-1" {
		t.Fatalf("failing produce: status %d id %q, want 503 and fault-1", code, id)
	}
	// A refusal: an unknown route.
	code, id = do("GET", "/nowhere", "", "refused-1")
	if code != 404 || id != "refused-1" {
		t.Fatalf("no route: status %d id %q, want 404 and refused-1", code, id)
	}
	lines := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		for _, want := range []string{"fault-1", "refused-1"} {
			if strings.Contains(l, "request_id="+want) {
				lines[want] = append(lines[want], l)
			}
		}
	}
	if f := lines["fault-1"]; len(f) != 2 || !strings.Contains(f[0], "broker line about the request") ||
		!strings.Contains(f[1], `msg="request failed"`) || !strings.Contains(f[1], "code=storage_failed") || !strings.Contains(f[1], "status=503") {
		t.Errorf("the fault's log lines: %q; want the broker's line and one request failed line, both with the id", f)
	}
	if r := lines["refused-1"]; len(r) != 1 || !strings.Contains(r[0], `msg="request refused"`) || !strings.Contains(r[0], "status=404") || !strings.Contains(r[0], "code=not_found") {
		t.Errorf("the refusal's log lines: %q; want one request refused line with the id", r)
	}
	if strings.Count(logs.String(), "healthz") != 0 {
		t.Errorf("a served request was logged: %s", logs.String())
	}
}

// TestRefusedLinesAreBounded: a client sending bad requests in a loop cannot flood the
// log; the next line written says how many were left out.
func TestRefusedLinesAreBounded(t *testing.T) {
	t.Parallel()
	var logs testutil.LockedBuffer
	log := slog.New(reqid.NewHandler(slog.NewTextHandler(&logs, nil)))
	h, err := New(benchBroker{}, Options{Logger: log, AllowedHosts: []string{"example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/nowhere", nil))
		if rec.Code != 404 {
			t.Fatalf("status %d, want 404", rec.Code)
		}
	}
	if n := strings.Count(logs.String(), "request refused"); n != failLogBurst {
		t.Errorf("%d refused lines for 100 refusals in a moment, want %d", n, failLogBurst)
	}
}
