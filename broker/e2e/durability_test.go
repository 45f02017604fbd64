package e2e

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// TestRestartKeepsQueueState: produce N, consume all and ack half, stop with SIGTERM
// and start again: no acked message is delivered again, every unacked one is, once.
func TestRestartKeepsQueueState(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t)
	const total = 60
	a.createTopic("rs", map[string]any{"partitions": 3, "visibility_timeout_ms": 60000})
	for i := 0; i < total; i++ {
		a.produceJSON("rs", map[string]any{"id": strconv.Itoa(i)}, "")
	}
	acked := map[string]bool{}
	unacked := map[string]bool{}
	for i := 0; i < total; i++ {
		m := a.mustConsume("rs", "5s")
		id := payloadID(t, m)
		// Ack every other message by id, so each partition has gaps (acked ahead).
		if k, _ := strconv.Atoi(id); k%2 == 0 {
			a.mustAck("rs", m)
			acked[id] = true
		} else {
			unacked[id] = true
		}
	}
	if m := a.consume("rs", ""); m != nil {
		t.Fatalf("everything is leased, yet got %s", m.where())
	}
	before := a.topic("rs")

	n.Restart()

	after := a.topic("rs")
	if after.Incarnation != before.Incarnation {
		t.Errorf("incarnation changed across a restart: %s -> %s", before.Incarnation, after.Incarnation)
	}
	for i, ps := range after.PartitionStats {
		b := before.PartitionStats[i]
		if ps.NextOffset != b.NextOffset || ps.AckFrontier < b.AckFrontier || ps.AckedAhead+ps.AckFrontier < b.AckedAhead+b.AckFrontier || ps.InFlight != 0 {
			t.Errorf("partition %d: before %+v, after %+v", i, b, ps)
		}
	}
	seen := map[string]int{}
	for _, m := range a.drain("rs") {
		seen[payloadID(t, &m)]++
	}
	for id := range acked {
		if seen[id] > 0 {
			t.Errorf("acked message %s was delivered again after the restart", id)
		}
	}
	for id := range unacked {
		if seen[id] != 1 {
			t.Errorf("unacked message %s was delivered %d times after the restart, want 1", id, seen[id])
		}
	}
	if len(seen) != len(unacked) {
		t.Errorf("delivered %d distinct messages after the restart, want %d", len(seen), len(unacked))
	}
	// Everything settled stays settled across a second restart.
	n.Restart()
	for i, ps := range a.topic("rs").PartitionStats {
		if ps.AckFrontier != ps.NextOffset || ps.Backlog != 0 {
			t.Errorf("partition %d after a second restart: %+v", i, ps)
		}
	}
	if m := a.consume("rs", "wait=500ms"); m != nil {
		t.Errorf("after settling everything and restarting, got %s", m.where())
	}
}

// TestKill9 runs producers and a consumer against the broker, kills it with SIGKILL
// while they run, and restarts it: every message answered 202 is there (drained by
// consume), and no message whose ack was answered 204 comes back.
func TestKill9(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t)
	a.createTopic("k9", map[string]any{"partitions": 4, "visibility_timeout_ms": 60000})

	var mu sync.Mutex
	accepted := map[string]bool{}   // 202 answered
	acked := map[string]bool{}      // ack answered 204
	maybeAcked := map[string]bool{} // an ack was sent; its answer may not have come
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const producers = 4
	for g := 0; g < producers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("p%d-%d", g, i)
				var r *testutil.Response
				var err error
				if i%5 == 4 {
					// Now and then a batch of three.
					body := fmt.Sprintf(`{"messages":[{"payload":{"id":"%s-a"}},{"payload":{"id":"%s-b"},"key":"%s"},{"payload":{"id":"%s-c"}}]}`, id, id, id, id)
					r, err = a.Try(http.MethodPost, "/v1/topics/k9/produce-batch", []byte(body), "Content-Type", "application/json")
					if err == nil && r.Status == http.StatusAccepted {
						mu.Lock()
						accepted[id+"-a"], accepted[id+"-b"], accepted[id+"-c"] = true, true, true
						mu.Unlock()
					}
				} else {
					r, err = a.Try(http.MethodPost, "/v1/topics/k9/produce", []byte(`{"id":"`+id+`"}`), "Content-Type", "application/json")
					if err == nil && r.Status == http.StatusAccepted {
						mu.Lock()
						accepted[id] = true
						mu.Unlock()
					}
				}
				if err != nil {
					return // the broker is gone
				}
				if r.Status != http.StatusAccepted && r.Status != http.StatusServiceUnavailable {
					t.Errorf("produce %s: %d %s", id, r.Status, r.Body)
					return
				}
			}
		}()
	}
	// One consumer acks as it goes; a message is "acked" only once the 204 arrived.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			r, err := a.Try(http.MethodGet, "/v1/topics/k9/consume?wait=1s", nil)
			if err != nil {
				return
			}
			if r.Status != http.StatusOK {
				continue
			}
			var m message
			if !r.JSON(t, &m) {
				return
			}
			id := payloadID(t, &m)
			mu.Lock()
			maybeAcked[id] = true
			mu.Unlock()
			ar, err := a.Try(http.MethodPost, "/v1/topics/k9/ack?receipt_handle="+m.ReceiptHandle, nil)
			if err != nil {
				return
			}
			mu.Lock()
			if ar.Status == http.StatusNoContent {
				acked[id] = true
			} else {
				delete(maybeAcked, id) // answered, and not settled
			}
			mu.Unlock()
		}
	}()

	waitFor(t, 30*time.Second, "some produced and acked messages", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(accepted) >= 300 && len(acked) >= 30
	})
	n.Kill()
	close(stop)
	wg.Wait()
	n.RestartAfterKill()

	mu.Lock()
	defer mu.Unlock()
	seen := map[string]int{}
	for _, m := range a.drain("k9") {
		seen[payloadID(t, &m)]++
	}
	lost := 0
	for id := range accepted {
		if !acked[id] && !maybeAcked[id] && seen[id] == 0 {
			if lost < 10 {
				t.Errorf("message %s was answered 202 but is gone after kill -9", id)
			}
			lost++
		}
	}
	var back []string
	for id := range acked {
		if seen[id] > 0 {
			back = append(back, id)
		}
	}
	sort.Strings(back)
	if lost > 0 || len(back) > 0 {
		t.Errorf("%d of %d accepted messages lost; %d of %d acked messages delivered again: %v", lost, len(accepted), len(back), len(acked), back)
	}
	for id, c := range seen {
		if c > 1 {
			t.Errorf("message %s delivered %d times in the drain after the restart", id, c)
		}
	}
	t.Logf("%d messages accepted, %d acked before the kill, %d delivered after", len(accepted), len(acked), len(seen))
}

// TestDeleteAndRecreate: a deleted topic's receipt handles answer 404 while the name is
// free and 410 once a new topic has it; the new topic has a new incarnation and
// nothing of the old one, by consume or by replay.
func TestDeleteAndRecreate(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	old := a.createTopic("dr", map[string]any{"partitions": 2})
	for i := 0; i < 6; i++ {
		a.produceJSON("dr", map[string]any{"id": "old-" + strconv.Itoa(i)}, "")
	}
	m := a.mustConsume("dr", "5s")
	m2 := a.mustConsume("dr", "5s")

	a.Do(http.MethodDelete, "/v1/topics/dr", nil).Expect(t, http.StatusNoContent)
	a.ack("dr", m.ReceiptHandle, "").ExpectError(t, http.StatusNotFound, "topic_not_found")
	a.ack("dr", m.ReceiptHandle, "true").ExpectError(t, http.StatusNotFound, "topic_not_found")
	a.Get("/v1/topics/dr/consume").ExpectError(t, http.StatusNotFound, "topic_not_found")
	a.Get("/v1/topics/dr/partitions/0/messages").ExpectError(t, http.StatusNotFound, "topic_not_found")

	cur := a.createTopic("dr", map[string]any{"partitions": 2})
	if cur.Incarnation == old.Incarnation || cur.Incarnation == "" {
		t.Errorf("recreated topic has incarnation %q, the deleted one had %q", cur.Incarnation, old.Incarnation)
	}
	for _, ext := range []string{"", "true", "0", "5s"} {
		r := a.ack("dr", m.ReceiptHandle, ext)
		if r.Status != http.StatusGone && !(r.Status == http.StatusBadRequest && r.ErrorCode() == "invalid_receipt_handle") {
			t.Errorf("old handle on the new topic (extend=%q): %d %s, want 410 (or 400 invalid_receipt_handle)", ext, r.Status, r.Body)
		}
	}
	// An ack-batch of old handles settles nothing either.
	r := a.PostJSON("/v1/topics/dr/ack-batch", map[string]any{"acks": []map[string]string{{"receipt_handle": m2.ReceiptHandle}}})
	var res struct {
		Results []ackResult `json:"results"`
	}
	if r.Expect(t, http.StatusOK) && r.JSON(t, &res) && (len(res.Results) != 1 || (res.Results[0].Status != 410 && res.Results[0].Status != 400)) {
		t.Errorf("ack-batch of an old handle: %s", r.Body)
	}
	for p := 0; p < 2; p++ {
		if mr := a.read("dr", p, "from=0"); len(mr.Messages) != 0 {
			t.Errorf("partition %d of the new topic replays %d old messages", p, len(mr.Messages))
		}
		if r := a.Get("/v1/topics/dr/consume?partition=" + strconv.Itoa(p) + "&offset=0"); r.Status != http.StatusNoContent {
			t.Errorf("partition %d offset 0 of the new topic: %d %s", p, r.Status, r.Body)
		}
	}
	if got := a.consume("dr", "wait=500ms"); got != nil {
		t.Errorf("the new topic delivered %s", got.Payload)
	}
	for _, ps := range a.topic("dr").PartitionStats {
		if ps.NextOffset != 0 || ps.AckFrontier != 0 || ps.Backlog != 0 {
			t.Errorf("new topic stats: %+v", ps)
		}
	}
	// The new topic works, and the stale handle still does not touch its messages.
	a.produceJSON("dr", map[string]any{"id": "new"}, "partition="+strconv.Itoa(int(m.Partition)))
	fresh := a.mustConsume("dr", "5s")
	if payloadID(t, fresh) != "new" {
		t.Errorf("new topic delivered %s", fresh.Payload)
	}
	if r := a.ack("dr", m.ReceiptHandle, ""); r.Status == http.StatusNoContent {
		t.Errorf("an old handle settled a message of the new topic")
	}
	a.mustAck("dr", fresh)
}

// TestLeasesEndAtRestart: leases live in memory, so a handle issued before a restart
// answers 410 after it (never settles the message's new lease), and the message is
// delivered again.
func TestLeasesEndAtRestart(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t)
	a.createTopic("lr", map[string]any{"partitions": 1, "visibility_timeout_ms": 600000})
	a.produceJSON("lr", map[string]any{"id": "a"}, "")
	a.produceJSON("lr", map[string]any{"id": "b"}, "")
	ma := a.mustConsume("lr", "5s")
	mb := a.mustConsume("lr", "5s")

	n.RestartAfterKill()

	again := a.mustConsume("lr", "5s") // at once: the 10-minute lease did not survive
	if again.Offset != ma.Offset {
		t.Errorf("first delivery after the restart is %s, want %s", again.where(), ma.where())
	}
	a.ack("lr", ma.ReceiptHandle, "").ExpectError(t, http.StatusGone, "lease_lost")
	a.ack("lr", mb.ReceiptHandle, "true").ExpectError(t, http.StatusGone, "lease_lost")
	a.ack("lr", mb.ReceiptHandle, "0").ExpectError(t, http.StatusGone, "lease_lost")
	a.mustAck("lr", again) // the stale acks did not spend the new lease
	b := a.mustConsume("lr", "5s")
	if b.Offset != mb.Offset {
		t.Errorf("second delivery after the restart is %s, want %s", b.where(), mb.where())
	}
	a.mustAck("lr", b)
	if ps := a.topic("lr").PartitionStats[0]; ps.AckFrontier != 2 || ps.Backlog != 0 {
		t.Errorf("after acking both: %+v", ps)
	}
}

// TestTopicMetadataSurvivesKill: creates, alters and deletes answered before a kill -9
// hold after the restart, and a topic deleted just before the kill can be created
// again empty.
func TestTopicMetadataSurvivesKill(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t)
	kept := a.createTopic("kept", map[string]any{"partitions": 5, "visibility_timeout_ms": 4321})
	a.createTopic("gone", map[string]any{"partitions": 2})
	a.produceJSON("gone", map[string]any{"id": "old"}, "")
	a.PatchJSON("/v1/topics/kept", map[string]any{"max_in_flight_per_partition": 17, "retention_ms": 86400000}).Expect(t, http.StatusOK)
	a.produceJSON("kept", map[string]any{"id": "k"}, "partition=3")
	a.Do(http.MethodDelete, "/v1/topics/gone", nil).Expect(t, http.StatusNoContent)

	n.RestartAfterKill()

	if names := a.topicNames(); len(names) != 1 || names[0] != "kept" {
		t.Errorf("topics after kill -9: %v, want [kept]", names)
	}
	d := a.topic("kept")
	if d.Incarnation != kept.Incarnation || d.Partitions != 5 || d.VisibilityTimeoutMs != 4321 ||
		d.MaxInFlightPerPartition != 17 || d.RetentionMs != 86400000 || d.PartitionStats[3].NextOffset != 1 {
		t.Errorf("kept after kill -9: %+v %+v", d.topicJSON, d.PartitionStats)
	}
	a.Get("/v1/topics/gone").ExpectError(t, http.StatusNotFound, "topic_not_found")
	a.createTopic("gone", map[string]any{"partitions": 2})
	for p := 0; p < 2; p++ {
		if mr := a.read("gone", p, ""); len(mr.Messages) != 0 {
			t.Errorf("recreated topic replays %d old messages in partition %d", len(mr.Messages), p)
		}
	}
}

// TestGracefulStop: SIGTERM answers parked long polls with 503 and Retry-After at
// once instead of holding them for their wait, and the broker exits 0 promptly.
func TestGracefulStop(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t)
	a.createTopic("gs", nil)
	type res struct {
		status int
		code   string
		err    error
	}
	ch := make(chan res, 2)
	for i := 0; i < 2; i++ {
		go func() {
			r, err := a.Try(http.MethodGet, "/v1/topics/gs/consume?wait=20s", nil)
			if err != nil {
				ch <- res{err: err}
				return
			}
			ch <- res{status: r.Status, code: r.ErrorCode()}
		}()
	}
	waitParked(t, a, 2)
	start := time.Now()
	n.Stop() // fails the test unless the exit is 0
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("SIGTERM with parked long polls took %v to exit", d)
	}
	for i := 0; i < 2; i++ {
		select {
		case r := <-ch:
			if r.err != nil || r.status != http.StatusServiceUnavailable || r.code != "unavailable" {
				t.Errorf("parked poll at shutdown: %d %q %v, want 503 unavailable", r.status, r.code, r.err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a parked poll did not end at shutdown")
		}
	}
}
