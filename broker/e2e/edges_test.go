package e2e

import (
	"net/http"
	"testing"
)

// TestReplayPastEndPointsAtEnd: a replay from beyond the end of a partition answers
// the end as next_offset, so a follower does not skip messages written later.
func TestReplayPastEndPointsAtEnd(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("a", map[string]any{"partitions": 1})
	a.produceJSON("a", map[string]any{"id": "0"}, "")
	mr := a.read("a", 0, "from=50")
	if len(mr.Messages) != 0 || mr.NextOffset != 1 {
		t.Fatalf("replay from 50 of a 1-message log: %d messages, next_offset %d; want none and 1", len(mr.Messages), mr.NextOffset)
	}
	a.produceJSON("a", map[string]any{"id": "1"}, "")
	if got := a.read("a", 0, "from=1"); len(got.Messages) != 1 {
		t.Fatalf("following from next_offset found %d messages", len(got.Messages))
	}
}

// TestHandleOfAnotherTopic: a receipt handle of another live topic is a bad handle
// (400) and does not disturb its own lease.
func TestHandleOfAnotherTopic(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("a", map[string]any{"partitions": 1})
	a.createTopic("b", map[string]any{"partitions": 1})
	a.produceJSON("a", map[string]any{"id": "x"}, "")
	m := a.mustConsume("a", "5s")
	a.ack("b", m.ReceiptHandle, "").ExpectError(t, http.StatusBadRequest, "invalid_receipt_handle")
	a.mustAck("a", m)
}
