//go:build failpoints

package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/failpoint"
)

// TestFailpointPartlyStoredBatchSaysSo sends a produce-batch whose messages go to two
// partitions and fails the first of the two writes (the failed write is undone): the
// other partition's messages are stored, so the 503 must not say the request was not
// stored, and must say that part of it was.
func TestFailpointPartlyStoredBatchSaysSo(t *testing.T) {
	defer failpoint.Set("")
	b, h := failpointNode(t, 2)
	// The two partitions are written in parallel: whichever reaches the point first fails.
	if err := failpoint.Set(failpoint.SegmentAfterWrite + ":eio@1"); err != nil {
		t.Fatal(err)
	}
	rec, body := postError(t, h, "/v1/topics/t/produce-batch",
		`{"messages":[{"payload":1,"partition":0},{"payload":2,"partition":1},{"payload":3,"partition":0}]}`)
	if rec.Code != 503 || body.Error.Code != "storage_failed" {
		t.Fatalf("got %d %s %q, want 503 storage_failed", rec.Code, body.Error.Code, body.Error.Message)
	}
	_, parts, err := b.Topic("t")
	if err != nil {
		t.Fatal(err)
	}
	stored, failed := 0, -1
	for i, p := range parts {
		if p.Stats.End > 0 {
			stored++
		} else {
			failed = i
		}
	}
	if stored != 1 {
		t.Fatalf("%d partitions hold messages, want 1 (one write failed, the other succeeded)", stored)
	}
	msg := body.Error.Message
	if strings.Contains(msg, "request was not stored") || !strings.Contains(msg, "part of the batch was stored") {
		t.Errorf("one partition of the batch was stored, yet the 503 says %q", msg)
	}
	if !strings.Contains(msg, fmt.Sprintf("partition(s) %d were not stored", failed)) {
		t.Errorf("the write to partition %d failed, yet the 503 does not name it: %q", failed, msg)
	}
}

// TestFailpointWriteNotUndoneIsMaybeStored fails a produce's write and the undo of it:
// the records may be found after a restart, so the answer is 503 maybe_stored, a code of
// its own (clients branch on codes, never on messages), not the storage_failed that
// tells them nothing was stored and a resend is safe.
func TestFailpointWriteNotUndoneIsMaybeStored(t *testing.T) {
	defer failpoint.Set("")
	_, h := failpointNode(t, 1)
	if err := failpoint.Set(failpoint.SegmentAfterWrite + ":eio@1;" + failpoint.SegmentUndo + ":eio"); err != nil {
		t.Fatal(err)
	}
	rec, body := postError(t, h, "/v1/topics/t/produce", `{"n":1}`)
	if rec.Code != 503 || body.Error.Code != "maybe_stored" || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("got %d %s %q (Retry-After %q), want 503 maybe_stored with a Retry-After", rec.Code, body.Error.Code, body.Error.Message, rec.Header().Get("Retry-After"))
	}
}

// failpointNode starts a node in a temp dir with topic "t" of the given partitions, and
// its HTTP handler; the node is closed when the test ends.
func failpointNode(t *testing.T, partitions int32) (*broker.Broker, http.Handler) {
	t.Helper()
	b, err := broker.Open(broker.Options{DataDir: t.TempDir(), NodeID: "n1",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RetentionInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic(ctx, broker.TopicSpec{Name: "t", Partitions: &partitions}); err != nil {
		t.Fatal(err)
	}
	h, err := New(b, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return b, h
}

// postError posts a JSON body to h and reads the error answer's code and message.
func postError(t *testing.T, h http.Handler, path, jsonBody string) (*httptest.ResponseRecorder, apiErrorBody) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", path, strings.NewReader(jsonBody))
	req.Host = "127.0.0.1"
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req)
	var body apiErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("answer %d %q is not a JSON error: %v", rec.Code, rec.Body.String(), err)
	}
	return rec, body
}

// apiErrorBody is an error answer's body, as tests read it.
type apiErrorBody struct {
	Error struct{ Code, Message string }
}
