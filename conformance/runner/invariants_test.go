package runner

import (
	"strings"
	"testing"
	"time"
)

// history builds a run whose recorded exchanges and driver events are given, for the
// invariants, with times in milliseconds from t0.
type fakeRun struct {
	r  *run
	t0 time.Time
}

func newFakeRun() *fakeRun {
	t0 := time.Now()
	return &fakeRun{t0: t0, r: &run{t0: t0, hist: &History{}, drv: &Driver{}}}
}

func (f *fakeRun) at(ms int) time.Time { return f.t0.Add(time.Duration(ms) * time.Millisecond) }

func (f *fakeRun) poll(from, to int, grants ...Grant) {
	f.r.hist.add(&Exchange{Method: "GET", Path: "/v1/topics/t/consume", Query: map[string]string{},
		Start: f.at(from), End: f.at(to), Status: 200, Upstream: 200, Grants: grants})
}

func (f *fakeRun) ack(from, to int, handle string, status int, extend ...string) {
	q := map[string]string{"receipt_handle": handle}
	if len(extend) > 0 {
		q["extend"] = extend[0]
	}
	f.r.hist.add(&Exchange{Method: "POST", Path: "/v1/topics/t/ack", Query: q,
		Start: f.at(from), End: f.at(to), Status: status, Upstream: status})
}

func (f *fakeRun) event(name string, data map[string]any) {
	f.r.drv.events = append(f.r.drv.events, Event{Name: name, Data: data, At: f.t0})
}

func g(handle string, offset, attempt int64) Grant {
	return Grant{Topic: "t", Handle: handle, Partition: 0, Offset: offset, Attempt: attempt}
}

func TestNoDeliveryAfterAck(t *testing.T) {
	cases := []struct {
		name  string
		build func(f *fakeRun)
		fail  string // "" when the invariant holds
	}{
		{"acked then leased again", func(f *fakeRun) {
			f.poll(0, 10, g("h1", 5, 1))
			f.ack(20, 30, "h1", 204)
			f.poll(40, 50, g("h2", 5, 2))
		}, "acked with 204"},
		{"leased again by a poll that began before the 204", func(f *fakeRun) {
			f.poll(0, 10, g("h1", 5, 1))
			f.poll(15, 40, g("h2", 5, 2))
			f.ack(20, 30, "h1", 204)
		}, ""},
		{"a 410 is no settlement", func(f *fakeRun) {
			f.poll(0, 10, g("h1", 5, 1), g("h9", 6, 1))
			f.ack(20, 30, "h1", 410)
			f.ack(20, 30, "h9", 204)
			f.poll(40, 50, g("h2", 5, 1))
		}, ""},
		{"an extend is no settlement", func(f *fakeRun) {
			f.poll(0, 10, g("h1", 5, 1), g("h9", 6, 1))
			f.ack(20, 30, "h1", 204, "0")
			f.ack(20, 30, "h9", 204)
			f.poll(40, 50, g("h2", 5, 2))
		}, ""},
		{"nothing acked", func(f *fakeRun) {
			f.poll(0, 10, g("h1", 5, 1))
		}, "nothing to check"},
	}
	for _, c := range cases {
		f := newFakeRun()
		c.build(f)
		err := noDeliveryAfterAck(f.r, map[string]any{})
		switch {
		case c.fail == "" && err != nil:
			t.Errorf("%s: %v, want it to hold", c.name, err)
		case c.fail != "" && (err == nil || !strings.Contains(err.Error(), c.fail)):
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.fail)
		}
	}
}

// After a change of partition leader, a message can be delivered again with the same
// attempt number. The lost lease is the old leader's (the first grant, or the one the
// event names); the new leader's delivery is acked legitimately. Picking the last
// grant of that attempt (as the check once did) reported this as a violation.
func TestNoAckAfterLeaseLostWithARepeatedAttempt(t *testing.T) {
	lost := map[string]any{"cancelled": true, "cancel_reason": "lease_lost",
		"message": map[string]any{"partition": 0.0, "offset": 0.0, "delivery_attempt": 1.0}}
	f := newFakeRun()
	f.poll(0, 10, g("old", 0, 1))
	f.ack(500, 510, "old", 410, "3000")
	f.poll(600, 610, g("new", 0, 1))
	f.ack(700, 710, "new", 204)
	f.event("handled", lost)
	if err := noAckAfterLeaseLost(f.r, map[string]any{}); err != nil {
		t.Fatalf("the new leader's delivery acked: %v, want it to hold", err)
	}
	// The lost lease itself acked: a violation, found by attempt or by handle.
	f.ack(520, 530, "old", 204)
	if err := noAckAfterLeaseLost(f.r, map[string]any{}); err == nil {
		t.Fatal("the lost lease was acked and the check held")
	}
	withHandle := newFakeRun()
	withHandle.poll(0, 10, g("old", 0, 1))
	withHandle.poll(600, 610, g("new", 0, 1))
	withHandle.ack(700, 710, "new", 204)
	withHandle.event("handled", map[string]any{"cancelled": true, "cancel_reason": "lease_lost",
		"message": map[string]any{"partition": 0.0, "offset": 0.0, "delivery_attempt": 1.0, "receipt_handle": "new"}})
	if err := noAckAfterLeaseLost(withHandle.r, map[string]any{}); err == nil {
		t.Fatal("the event names the acked handle as lost and the check held")
	}
}
