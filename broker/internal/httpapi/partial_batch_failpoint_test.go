//go:build failpoints

package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
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
	b, err := broker.Open(broker.Options{DataDir: t.TempDir(), NodeID: "n1",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RetentionInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	two := int32(2)
	if _, err := b.CreateTopic(ctx, broker.TopicSpec{Name: "t", Partitions: &two}); err != nil {
		t.Fatal(err)
	}
	h, err := New(b, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// The two partitions are written in parallel: whichever reaches the point first fails.
	if err := failpoint.Set(failpoint.SegmentAfterWrite + ":eio@1"); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/v1/topics/t/produce-batch", strings.NewReader(
		`{"messages":[{"payload":1,"partition":0},{"payload":2,"partition":1},{"payload":3,"partition":0}]}`))
	req.Host = "127.0.0.1"
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req)
	var body struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("answer %d %q is not a JSON error: %v", rec.Code, rec.Body.String(), err)
	}
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
