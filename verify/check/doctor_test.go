package check

import (
	"testing"

	"github.com/narad-mq/narad/verify/history"
)

// TestDoctorAckedRedeliveryPassesOverADamagedSettle: the doctor took the first acked
// message of orders, and when the harness had damaged that ack's settle record (and the
// node reported skipping it) the checker rightly excused the doctored redelivery, so the
// kill loop's self-test failed (seed 40973359, 7 December). It now takes an ack whose
// settle record was not damaged.
func TestDoctorAckedRedeliveryPassesOverADamagedSettle(t *testing.T) {
	s := int64(1000 * msec)
	x := newH().produce("a", 0, 0).deliver("a", 0, "h1", 10*msec).settle(history.OpAck, "a", 0, "h1", 20*msec, 204).
		produce("b", 1, 30*msec).deliver("b", 1, "g1", 40*msec).settle(history.OpAck, "b", 1, "g1", 50*msec, 204).
		kill(s, s+msec).damaged("journal", "a", 0, 2*s).skipped("journal", -1, 3*s).
		deliver("a", 0, "h2", 4*s).settle(history.OpAck, "a", 0, "h2", 4*s+10*msec, 204)
	if r := Check(x.es); !r.OK() {
		t.Fatalf("the history before doctoring is flagged: %v %v", r.Violations, r.Examples)
	}
	doctored, what, err := Doctor(x.es, "acked-redelivery")
	if err != nil {
		t.Fatalf("doctor acked-redelivery: %v", err)
	}
	if r := Check(doctored); r.Violations["acked-redelivered"] == 0 {
		t.Fatalf("doctored with acked-redelivery (%s): flagged %v", what, r.Violations)
	}
}

// TestDoctorLostPassesOverADamagedMessage: a message whose record the harness damaged,
// and the node reported skipping, may legally never be delivered; the doctor's lost
// message must be another one, or the checker rightly passes the doctored history.
func TestDoctorLostPassesOverADamagedMessage(t *testing.T) {
	s := int64(1000 * msec)
	x := newH().produce("a", 0, 0).
		produce("b", 1, 30*msec).deliver("b", 1, "g1", 40*msec).settle(history.OpAck, "b", 1, "g1", 50*msec, 204).
		kill(s, s+msec).damaged("log", "a", 0, 2*s).skipped("log", 0, 3*s)
	if r := Check(x.es); !r.OK() {
		t.Fatalf("the history before doctoring is flagged: %v lost %v %v", r.Violations, r.Lost, r.Examples)
	}
	doctored, what, err := Doctor(x.es, "lost")
	if err != nil {
		t.Fatalf("doctor lost: %v", err)
	}
	if r := Check(doctored); r.Lost["orders"] != 1 {
		t.Fatalf("doctored with lost (%s): lost %v, want orders 1", what, r.Lost)
	}
}
