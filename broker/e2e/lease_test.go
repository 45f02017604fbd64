package e2e

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLeaseExpiry: a message not acked within visibility_timeout_ms comes back with
// delivery_attempt 2, never before its lease ended, and the old handle's ack is 410.
func TestLeaseExpiry(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("lease", map[string]any{"partitions": 1, "visibility_timeout_ms": 300})
	a.produceJSON("lease", map[string]any{"id": "m"}, "")

	sent := time.Now()
	first := a.mustConsume("lease", "5s")
	if first.DeliveryAttempt != 1 {
		t.Errorf("first delivery_attempt %d", first.DeliveryAttempt)
	}
	var again *message
	waitFor(t, 15*time.Second, "the message to come back after its lease lapsed", func() bool {
		again = a.consume("lease", "wait=2s")
		return again != nil
	})
	// The lease was granted after `sent`, so it cannot have ended before sent+300ms.
	if d := time.Since(sent); d < 300*time.Millisecond {
		t.Errorf("redelivered %v after the consume was sent, before the 300 ms lease could end", d)
	}
	if again.Offset != first.Offset || again.DeliveryAttempt != 2 || again.ReceiptHandle == first.ReceiptHandle {
		t.Errorf("redelivery: offset %d attempt %d same handle %v", again.Offset, again.DeliveryAttempt, again.ReceiptHandle == first.ReceiptHandle)
	}
	a.ack("lease", first.ReceiptHandle, "").ExpectError(t, http.StatusGone, "lease_lost")
	a.ack("lease", first.ReceiptHandle, "true").ExpectError(t, http.StatusGone, "lease_lost")
	a.ack("lease", first.ReceiptHandle, "0").ExpectError(t, http.StatusGone, "lease_lost")
	// The late ack did not touch the new lease.
	a.ack("lease", again.ReceiptHandle, "").Expect(t, http.StatusNoContent)
	a.ack("lease", again.ReceiptHandle, "").ExpectError(t, http.StatusGone, "lease_lost")
	if m := a.consume("lease", "wait=1s"); m != nil {
		t.Errorf("settled message delivered again: %+v", m)
	}
}

// TestExtendKeepsLease: extend=true renews the lease for the visibility timeout, so a
// message kept alive by renewals stays away well past its original timeout; once the
// renewals stop it comes back. A second consumer polls all along.
//
// Only what the timestamps prove counts as a failure: a redelivery seen while a
// renewal sent at s must hold the lease until at least s+visibility.
func TestExtendKeepsLease(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	const vis = 1000 * time.Millisecond
	a.createTopic("ext", map[string]any{"partitions": 1, "visibility_timeout_ms": vis.Milliseconds()})
	a.produceJSON("ext", map[string]any{"id": "m"}, "")

	leaseFrom := time.Now() // the lease lasts at least until leaseFrom+vis
	m := a.mustConsume("ext", "5s")
	start := time.Now()
	slow := false
	for time.Since(start) < 3*vis {
		time.Sleep(vis / 4) // pacing between renewals, not a wait for a state
		sentAt := time.Now()
		r := a.ack("ext", m.ReceiptHandle, "true")
		if r.Status == http.StatusGone && time.Since(leaseFrom) > vis {
			slow = true // we were too slow to renew in time: nothing is proven
			break
		}
		if !r.Expect(t, http.StatusNoContent) {
			break
		}
		leaseFrom = sentAt
		if other := a.consume("ext", ""); other != nil {
			if time.Since(leaseFrom) < vis {
				t.Fatalf("a renewed message was delivered to another consumer %v after the renewal: %+v", time.Since(leaseFrom), other)
			}
			slow = true
			break
		}
	}
	if slow {
		t.Skip("the machine was too slow to renew within the lease; nothing to conclude")
	}
	if held := time.Since(start); held < 2*vis {
		t.Errorf("held the lease only %v", held)
	}
	// Stop renewing: it comes back, not before the last renewal's lease ended.
	var again *message
	waitFor(t, 15*time.Second, "the message after the renewals stopped", func() bool {
		again = a.consume("ext", "wait=2s")
		return again != nil
	})
	if d := time.Since(leaseFrom); d < vis {
		t.Errorf("redelivered %v after the last renewal, inside its %v lease", d, vis)
	}
	if again.DeliveryAttempt != 2 {
		t.Errorf("delivery_attempt %d after renewals, want 2", again.DeliveryAttempt)
	}
	a.ack("ext", m.ReceiptHandle, "").ExpectError(t, http.StatusGone, "lease_lost")
	a.mustAck("ext", again)
}

// TestNack: extend=0 hands the message back at once (the old handle is spent);
// extend=<duration> hides it for about that long.
func TestNack(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("nack", map[string]any{"partitions": 1, "visibility_timeout_ms": 60000})
	a.produceJSON("nack", map[string]any{"id": "m"}, "")

	m := a.mustConsume("nack", "5s")
	a.ack("nack", m.ReceiptHandle, "0").Expect(t, http.StatusNoContent)
	back := a.consume("nack", "") // no wait: it must be there at once
	if back == nil || back.Offset != m.Offset || back.DeliveryAttempt != 2 {
		t.Fatalf("after extend=0 the message was not available at once: %+v", back)
	}
	a.ack("nack", m.ReceiptHandle, "").ExpectError(t, http.StatusGone, "lease_lost")
	a.ack("nack", m.ReceiptHandle, "0").ExpectError(t, http.StatusGone, "lease_lost")

	// extend=1s: hidden now, visible after about a second.
	for _, ext := range []string{"1s", "1000"} {
		sent := time.Now()
		a.ack("nack", back.ReceiptHandle, ext).Expect(t, http.StatusNoContent)
		if m := a.consume("nack", ""); m != nil && time.Since(sent) < time.Second {
			t.Errorf("extend=%s: visible again after %v", ext, time.Since(sent))
		}
		var later *message
		waitFor(t, 15*time.Second, "the message after extend="+ext, func() bool {
			later = a.consume("nack", "wait=2s")
			return later != nil
		})
		if d := time.Since(sent); d < time.Second {
			t.Errorf("extend=%s: redelivered after %v", ext, d)
		}
		if later.Offset != m.Offset || later.DeliveryAttempt != back.DeliveryAttempt+1 {
			t.Errorf("extend=%s: came back as %+v", ext, later)
		}
		a.ack("nack", back.ReceiptHandle, "").ExpectError(t, http.StatusGone, "lease_lost")
		back = later
	}
	// A short extend on a long lease shortens it: extend=500ms then it returns soon.
	a.ack("nack", back.ReceiptHandle, "500ms").Expect(t, http.StatusNoContent)
	waitFor(t, 15*time.Second, "the message after extend=500ms", func() bool {
		back = a.consume("nack", "wait=2s")
		return back != nil
	})
	a.mustAck("nack", back)
	if d := a.topic("nack"); d.PartitionStats[0].AckFrontier != 1 || d.PartitionStats[0].Backlog != 0 {
		t.Errorf("after the final ack: %+v", d.PartitionStats[0])
	}
}

// TestLongPoll: a consume parked with wait=10s returns promptly when a message
// arrives; with nothing to deliver it answers 204 after about the wait.
func TestLongPoll(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("lp", map[string]any{"partitions": 3})

	type result struct {
		m    *message
		done time.Time
	}
	ch := make(chan result, 1)
	go func() {
		m := a.consume("lp", "wait=10s")
		ch <- result{m, time.Now()}
	}()
	waitParked(t, a, 1)
	p := a.produceJSON("lp", map[string]any{"id": "wake"}, "")
	producedAt := time.Now()
	select {
	case r := <-ch:
		if r.m == nil || r.m.Offset != p.Offset || r.m.Partition != p.Partition {
			t.Fatalf("the parked consume returned %+v", r.m)
		}
		if d := r.done.Sub(producedAt); d > 5*time.Second {
			t.Errorf("the parked consume returned %v after the produce", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the parked consume did not return")
	}

	// Nothing to deliver: 204 after about the wait (whole seconds and a duration).
	for _, c := range []struct {
		w    string
		want time.Duration
	}{{"1", time.Second}, {"1500ms", 1500 * time.Millisecond}} {
		w, want := c.w, c.want
		start := time.Now()
		r := a.Get("/v1/topics/lp/consume?wait=" + w)
		d := time.Since(start)
		r.Expect(t, http.StatusNoContent)
		if d < want-50*time.Millisecond || d > want+10*time.Second {
			t.Errorf("wait=%s answered 204 after %v", w, d)
		}
	}
	start := time.Now()
	if r := a.Get("/v1/topics/lp/consume-batch?wait=1s"); r.Status != http.StatusNoContent || time.Since(start) < 950*time.Millisecond {
		t.Errorf("consume-batch wait=1s: %d after %v", r.Status, time.Since(start))
	}
	// wait=0 answers at once.
	start = time.Now()
	a.Get("/v1/topics/lp/consume?wait=0").Expect(t, http.StatusNoContent)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("wait=0 took %v", d)
	}
}

// TestInFlightCap: with max_in_flight_per_partition=2 on one partition, a third
// consume gets 204; an ack frees a slot, and a parked consume is woken by it.
func TestInFlightCap(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("cap", map[string]any{"partitions": 1, "max_in_flight_per_partition": 2})
	for i := 0; i < 4; i++ {
		a.produceJSON("cap", map[string]any{"id": strconv.Itoa(i)}, "")
	}
	m0 := a.mustConsume("cap", "5s")
	m1 := a.mustConsume("cap", "5s")
	if m := a.consume("cap", ""); m != nil {
		t.Fatalf("third consume with 2 in flight got %s", m.where())
	}
	if ms := a.consumeBatch("cap", 10, "0"); len(ms) != 0 {
		t.Errorf("consume-batch at the cap got %d messages", len(ms))
	}
	if ps := a.topic("cap").PartitionStats[0]; ps.InFlight != 2 || ps.Backlog != 4 {
		t.Errorf("stats at the cap: %+v", ps)
	}
	a.mustAck("cap", m0)
	m2 := a.consume("cap", "")
	if m2 == nil || m2.Offset != 2 {
		t.Fatalf("after an ack a consume got %+v, want offset 2", m2)
	}
	// At the cap again: a parked consume wakes when a nack frees a slot.
	ch := make(chan *message, 1)
	go func() { ch <- a.consume("cap", "wait=10s") }()
	waitParked(t, a, 1)
	a.ack("cap", m1.ReceiptHandle, "0").Expect(t, http.StatusNoContent)
	select {
	case m := <-ch:
		if m == nil || (m.Offset != 1 && m.Offset != 3) {
			t.Errorf("the parked consume got %+v after a slot freed", m)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the parked consume did not return")
	}
}

// TestAckedAheadCap: a consume leases no message further past the ack frontier than
// max_acked_ahead_per_partition, so every ack of what it leased fits. With the cap
// lowered to 1 under leases granted before, settling a second offset past the frontier
// answers 503 acked_ahead_full with Retry-After and changes nothing; settling the
// frontier makes room.
func TestAckedAheadCap(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("ahead", map[string]any{"partitions": 1, "max_acked_ahead_per_partition": 3})
	for i := 0; i < 4; i++ {
		a.produceJSON("ahead", map[string]any{"id": strconv.Itoa(i)}, "")
	}
	ms := a.consumeBatch("ahead", 4, "5s")
	if len(ms) != 4 {
		t.Fatalf("got %d messages", len(ms))
	}
	a.PatchJSON("/v1/topics/ahead", map[string]any{"max_acked_ahead_per_partition": 1}).Expect(t, http.StatusOK)
	a.mustAck("ahead", &ms[2]) // acked ahead: {2}
	full := func(m *message) {
		t.Helper()
		r := a.ack("ahead", m.ReceiptHandle, "")
		if r.ExpectError(t, http.StatusServiceUnavailable, "acked_ahead_full") {
			if ra, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || ra < 1 {
				t.Errorf("Retry-After %q", r.Header.Get("Retry-After"))
			}
		}
	}
	full(&ms[3])
	if ps := a.topic("ahead").PartitionStats[0]; ps.AckFrontier != 0 || ps.AckedAhead != 1 || ps.InFlight != 3 {
		t.Errorf("after the refused ack: %+v", ps)
	}
	// ack-batch reports the same per entry.
	r := a.PostJSON("/v1/topics/ahead/ack-batch", map[string]any{"acks": []map[string]string{{"receipt_handle": ms[3].ReceiptHandle}}})
	var res struct {
		Results []ackResult `json:"results"`
	}
	if r.Expect(t, http.StatusOK) && r.JSON(t, &res) {
		if len(res.Results) != 1 || res.Results[0].Status != 503 || res.Results[0].Error == nil || res.Results[0].Error.Code != "acked_ahead_full" {
			t.Errorf("ack-batch at the cap: %s", r.Body)
		}
	}
	a.mustAck("ahead", &ms[0]) // the frontier itself is always accepted: frontier 1
	full(&ms[3])               // {2} still ahead of frontier 1
	a.mustAck("ahead", &ms[1]) // frontier jumps to 3
	if ps := a.topic("ahead").PartitionStats[0]; ps.AckFrontier != 3 || ps.AckedAhead != 0 {
		t.Errorf("after settling 0..2: %+v", ps)
	}
	a.mustAck("ahead", &ms[3]) // the refused ack kept its lease and settles now
	if ps := a.topic("ahead").PartitionStats[0]; ps.AckFrontier != 4 || ps.Backlog != 0 || ps.InFlight != 0 {
		t.Errorf("after settling everything: %+v", ps)
	}
	// Under the cap of 1, a consume leases the frontier and one past it, no more.
	for i := 4; i < 7; i++ {
		a.produceJSON("ahead", map[string]any{"id": strconv.Itoa(i)}, "")
	}
	if got := a.consumeBatch("ahead", 3, "1s"); len(got) != 2 || got[0].Offset != 4 || got[1].Offset != 5 {
		t.Errorf("a consume with the frontier at 4 and 1 ack ahead allowed got %d messages; want offsets 4 and 5", len(got))
	}
}

// TestRacingAcksSameHandle: many clients acking one handle at once: exactly one 204,
// every other 410.
func TestRacingAcksSameHandle(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("race", map[string]any{"partitions": 1})
	for round := 0; round < 5; round++ {
		a.produceJSON("race", map[string]any{"id": strconv.Itoa(round)}, "")
		m := a.mustConsume("race", "5s")
		const n = 16
		var ok, gone, other atomic.Int32
		var wg sync.WaitGroup
		startGun := make(chan struct{})
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-startGun
				switch r := a.ack("race", m.ReceiptHandle, ""); r.Status {
				case http.StatusNoContent:
					ok.Add(1)
				case http.StatusGone:
					if r.ErrorCode() != "lease_lost" {
						t.Errorf("410 with code %q", r.ErrorCode())
					}
					gone.Add(1)
				default:
					t.Errorf("racing ack: %d %s", r.Status, r.Body)
					other.Add(1)
				}
			}()
		}
		close(startGun)
		wg.Wait()
		if ok.Load() != 1 || gone.Load() != n-1 {
			t.Errorf("round %d: %d acks got 204 and %d got 410, want 1 and %d", round, ok.Load(), gone.Load(), n-1)
		}
	}
	if ps := a.topic("race").PartitionStats[0]; ps.AckFrontier != 5 || ps.AckedAhead != 0 {
		t.Errorf("after 5 settled messages: %+v", ps)
	}
	if m := a.consume("race", "wait=500ms"); m != nil {
		t.Errorf("a settled message came back: %s", m.where())
	}
}

// TestRacingAcksFrontier: acks of adjacent offsets sent in reverse order and in
// racing pairs; the ack frontier a poller sees never moves back and ends at the end.
func TestRacingAcksFrontier(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	const n = 300
	a.createTopic("front", map[string]any{"partitions": 1, "max_in_flight_per_partition": 1000})
	var msgs []map[string]any
	for i := 0; i < n; i++ {
		msgs = append(msgs, map[string]any{"payload": i})
	}
	a.PostJSON("/v1/topics/front/produce-batch", map[string]any{"messages": msgs}).Expect(t, http.StatusAccepted)
	var ms []message
	for len(ms) < n {
		got := a.consumeBatch("front", n-len(ms), "5s")
		if len(got) == 0 {
			t.Fatalf("leased %d of %d", len(ms), n)
		}
		ms = append(ms, got...)
	}
	byOffset := make([]*message, n)
	for i := range ms {
		byOffset[ms[i].Offset] = &ms[i]
	}

	stop := make(chan struct{})
	var polls atomic.Int32
	pollDone := make(chan struct{})
	go func() {
		defer close(pollDone)
		last := int64(-1)
		for {
			select {
			case <-stop:
				return
			default:
			}
			r := a.Get("/v1/topics/front")
			var d topicDetail
			if r.Status != http.StatusOK || !r.JSON(t, &d) {
				t.Errorf("polling the topic: %d", r.Status)
				return
			}
			f := d.PartitionStats[0].AckFrontier
			if f < last {
				t.Errorf("ack_frontier moved back from %d to %d", last, f)
			}
			last = f
			polls.Add(1)
		}
	}()

	// Pairs (2k, 2k+1) race each other; the pairs go from the end to the start, so the
	// frontier only moves when the last pair (0, 1) lands.
	var wg sync.WaitGroup
	for k := n/2 - 1; k >= 0; k-- {
		for _, off := range []int{2*k + 1, 2 * k} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.ack("front", byOffset[off].ReceiptHandle, "").Expect(t, http.StatusNoContent)
			}()
		}
		if k%10 == 0 {
			wg.Wait() // bound the number of requests in flight
		}
	}
	wg.Wait()
	waitFor(t, 10*time.Second, "a few polls of the frontier", func() bool { return polls.Load() >= 3 })
	close(stop)
	<-pollDone
	ps := a.topic("front").PartitionStats[0]
	if ps.AckFrontier != n || ps.AckedAhead != 0 || ps.Backlog != 0 || ps.InFlight != 0 {
		t.Errorf("after every ack: %+v, want frontier %d and nothing ahead", ps, n)
	}
}

// TestAlterVisibility: a new visibility timeout applies to leases taken after the
// change; a lease taken before keeps its length.
func TestAlterVisibility(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("av", map[string]any{"partitions": 1, "visibility_timeout_ms": 600000})
	a.produceJSON("av", map[string]any{"id": "long"}, "")
	a.produceJSON("av", map[string]any{"id": "short"}, "")
	long := a.mustConsume("av", "5s")
	a.PatchJSON("/v1/topics/av", map[string]any{"visibility_timeout_ms": 300}).Expect(t, http.StatusOK)
	short := a.mustConsume("av", "5s")
	var again *message
	waitFor(t, 15*time.Second, "the short lease to lapse", func() bool {
		again = a.consume("av", "wait=2s")
		return again != nil
	})
	if again.Offset != short.Offset {
		t.Errorf("redelivered %s; the lease taken before the change (%s, 10 min) must hold", again.where(), long.where())
	}
	a.mustAck("av", long)
	a.mustAck("av", again)
}
