package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/testutil"
)

// TestStorageErrorSaysWhetherAnythingMayBeStored: a 503 storage_failed claims nothing
// was stored only when the failed write was undone; one that could not be undone has
// its own code, maybe_stored, since clients branch on codes, never on messages: with
// storage_failed for both, the SDKs resent such a produce as one that stored nothing,
// duplicates not allowed.
func TestStorageErrorSaysWhetherAnythingMayBeStored(t *testing.T) {
	t.Parallel()
	undone := toAPIError(errors.Join(broker.ErrStorage, errors.New("eio")))
	notUndone := toAPIError(errors.Join(broker.ErrStorage, broker.ErrMaybeStored, errors.New("eio")))
	if undone.status != 503 || notUndone.status != 503 || undone.code != "storage_failed" || notUndone.code != "maybe_stored" {
		t.Fatalf("got %d %s and %d %s, want 503 storage_failed and 503 maybe_stored", undone.status, undone.code, notUndone.status, notUndone.code)
	}
	if !isFault(notUndone.code, notUndone.status) {
		t.Errorf("a write not undone is not logged as a fault")
	}
	if !strings.Contains(undone.msg, "not stored") {
		t.Errorf("undone write: message %q should say it was not stored", undone.msg)
	}
	if strings.Contains(notUndone.msg, "not stored") || !strings.Contains(notUndone.msg, "may be found stored") {
		t.Errorf("write not undone: message %q must not claim nothing was stored", notUndone.msg)
	}
}

// TestPartlyStoredKeepsTheCode: a batch of which only part was stored keeps the code of
// its failure and says what was and what may be stored.
func TestPartlyStoredKeepsTheCode(t *testing.T) {
	t.Parallel()
	part := &broker.PartlyStoredError{Failed: []int32{0, 2}, Stored: 3}
	full := toAPIError(errors.Join(part, broker.ErrDiskFull, errors.New("enospc")))
	if full.status != 503 || full.code != "disk_full" || !strings.Contains(full.msg, "part of the batch was stored") ||
		!strings.Contains(full.msg, "partition(s) 0, 2 were not stored") || strings.Contains(full.msg, "nothing was stored") {
		t.Errorf("disk full in part of a batch: got %d %s %q", full.status, full.code, full.msg)
	}
	maybe := toAPIError(errors.Join(part, broker.ErrStorage, broker.ErrMaybeStored, errors.New("eio")))
	if maybe.code != "maybe_stored" || !strings.Contains(maybe.msg, "could not undo") || !strings.Contains(maybe.msg, "part of the batch was stored") {
		t.Errorf("a write not undone in part of a batch: got %s %q", maybe.code, maybe.msg)
	}
	// Deleted meanwhile: 404 (nothing to retry), but the stored part may have been
	// delivered before the delete, so the message says it was stored.
	gone := toAPIError(errors.Join(part, broker.ErrTopicNotFound))
	if gone.status != 404 || gone.code != "topic_not_found" || !strings.Contains(gone.msg, "part of the batch was stored") {
		t.Errorf("a batch whose topic was deleted meanwhile: got %d %s %q, want 404 topic_not_found saying part of the batch was stored", gone.status, gone.code, gone.msg)
	}
	// Deleted meanwhile and created again before the answer (a cluster): retry (503),
	// and still say the part stored went to the deleted topic.
	again := toAPIError(errors.Join(part, fmt.Errorf("%w: %w: topic %q", broker.ErrUnavailable, broker.ErrTopicRecreated, "t")))
	if again.status != 503 || again.code != "unavailable" || again.retryAfter == 0 || !strings.Contains(again.msg, "part of the batch was stored") ||
		!strings.Contains(again.msg, "deleted and created again") {
		t.Errorf("a batch whose topic was deleted and created again meanwhile: got %d %s %q, want 503 unavailable saying part of the batch was stored", again.status, again.code, again.msg)
	}
	// Not found where the node looked, and no controller to ask whether it exists
	// again: retry (503), still saying part of the batch was stored.
	unasked := toAPIError(errors.Join(part, fmt.Errorf("%w: %w (topic %q)", broker.ErrUnavailable, broker.ErrTopicGoneUnconfirmed, "t")))
	if unasked.status != 503 || unasked.code != "unavailable" || unasked.retryAfter == 0 || !strings.Contains(unasked.msg, "part of the batch was stored") ||
		!strings.Contains(unasked.msg, "controller could not be asked") {
		t.Errorf("a batch whose topic was not found while it was written, the controller out of reach: got %d %s %q, want 503 unavailable saying part of the batch was stored", unasked.status, unasked.code, unasked.msg)
	}
}

// TestPartlyStoredAcrossNodes: in a cluster a batch spanning partitions can fail in a
// partition whose holder is down, busy or silent while the others store their share.
// The answer must say that part was stored: "nothing was done" would make the client
// retry the whole batch believing nothing could be duplicated.
func TestPartlyStoredAcrossNodes(t *testing.T) {
	t.Parallel()
	part := &broker.PartlyStoredError{Failed: []int32{1}, Stored: 2}
	for _, tc := range []struct {
		err  error
		code string
	}{
		{errors.Join(broker.ErrUnavailable, broker.ErrPartitionDown), "unavailable"},
		{errors.Join(broker.ErrUnavailable, broker.ErrPeerSaturated), "unavailable"},
		{broker.ErrOutcomeUnknown, "timeout"},
		// The chaos tier's find: a failed partition had no leader this node could reach
		// (an election, or too few replicas up) and the whole answer read "unavailable".
		{fmt.Errorf("%w: partition 1 of topic %q has no leader this node can reach", broker.ErrUnavailable, "orders"), "unavailable"},
		// Whatever else fails a share, the stored part is still said, with the failure's
		// own code.
		{errors.New("something unforeseen"), "internal"},
	} {
		got := toAPIError(errors.Join(part, tc.err))
		if got.status < 500 || string(got.code) != tc.code || got.retryAfter == 0 {
			t.Errorf("%v in part of a batch: got %d %s retry %d, want 503 %s with Retry-After", tc.err, got.status, got.code, got.retryAfter, tc.code)
		}
		if !strings.Contains(got.msg, "part of the batch was stored") || !strings.Contains(got.msg, "partition(s) 1") ||
			strings.Contains(got.msg, "nothing was done") || strings.Contains(got.msg, "did not send this one") {
			t.Errorf("%v in part of a batch: message %q must say which part was stored", tc.err, got.msg)
		}
	}
}

// TestAnUnknownOutcomeOutranksAFullDisk: a produce over several partitions joins their
// errors; when one partition's disk is full (or its write failed) and another's holder
// went silent after it was sent its share, the answer must not say that share was not
// stored. It said "nothing was stored" (or named it among the partitions "not
// stored"), and a client that trusted it stored a second copy.
func TestAnUnknownOutcomeOutranksAFullDisk(t *testing.T) {
	t.Parallel()
	unknown := fmt.Errorf("%w: node n2 did not answer", broker.ErrOutcomeUnknown)
	for _, other := range []error{broker.ErrDiskFull, broker.ErrStorage} {
		all := toAPIError(errors.Join(other, unknown))
		if all.code != "timeout" || strings.Contains(all.msg, "not stored") {
			t.Errorf("%v and an unknown outcome, nothing stored for sure: got %d %s %q, want 503 timeout", other, all.status, all.code, all.msg)
		}
		part := &broker.PartlyStoredError{Failed: []int32{0, 1}, Stored: 2}
		some := toAPIError(errors.Join(part, other, unknown))
		if some.code != "timeout" || strings.Contains(some.msg, "were not stored") || !strings.Contains(some.msg, "may or may not be stored") {
			t.Errorf("%v and an unknown outcome in part of a batch: got %d %s %q, want 503 timeout saying partitions 0, 1 may or may not be stored", other, some.status, some.code, some.msg)
		}
	}
}

// TestPartlyStoredIsInTheBody: the part of a batch that was stored is in the error body
// (partly_stored: how many messages, which partitions failed), which the SDKs read,
// never the message; an answer without a stored part has none. The body matches
// openapi.yaml. On the old code only the message said so, and the SDKs, which branch on
// codes, resent the whole batch: its stored part was stored twice.
func TestPartlyStoredIsInTheBody(t *testing.T) {
	t.Parallel()
	v, err := testutil.LoadOpenAPIValidator()
	if err != nil {
		t.Fatal(err)
	}
	part := &broker.PartlyStoredError{Failed: []int32{0, 2}, Stored: 3}
	for _, c := range []struct {
		err  error
		want string
	}{
		{errors.Join(part, broker.ErrStorage, errors.New("eio")), `"partly_stored":{"stored":3,"failed_partitions":[0,2]}`},
		{errors.Join(part, broker.ErrTopicNotFound), `"partly_stored":{"stored":3,"failed_partitions":[0,2]}`},
		{errors.Join(broker.ErrStorage, errors.New("eio")), ""},
	} {
		rec := httptest.NewRecorder()
		writeError(rec, c.err)
		body := rec.Body.String()
		var got struct {
			Error struct {
				PartlyStored *struct {
					Stored           int     `json:"stored"`
					FailedPartitions []int32 `json:"failed_partitions"`
				} `json:"partly_stored"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("%v: the body %q is not JSON: %v", c.err, body, err)
		}
		switch {
		case c.want == "" && got.Error.PartlyStored != nil:
			t.Errorf("%v: nothing was stored, yet the body says %q", c.err, body)
		case c.want != "" && !strings.Contains(body, c.want):
			t.Errorf("%v: the body %q does not say %s", c.err, body, c.want)
		}
		req := httptest.NewRequest("POST", "/v1/topics/t/produce-batch", nil)
		if err := v.ValidateResponse(req, rec.Code, rec.Header(), rec.Body.Bytes()); err != nil {
			t.Errorf("%v: the answer breaks openapi.yaml: %v (%d %s)", c.err, err, rec.Code, body)
		}
	}
}
