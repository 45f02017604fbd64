package partition

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestRetentionKeepsATornCommandsPrefixUntilItIsAppliedAgain: after a power loss that
// kept part of an append command's records, a replica that knows nothing yet of its
// group's history (no snapshot: a young group) tells the torn command from a stale one
// by the records it holds of it, when the command is applied again. Retention running
// before that (the leader not heard yet, the node down past the retention period)
// removed those records: the torn command was taken for a stale one and skipped, and
// every later append with it, so the replica never held another message, and once it
// led it answered 202 for messages stored at offsets where the others held others.
func TestRetentionKeepsATornCommandsPrefixUntilItIsAppliedAgain(t *testing.T) {
	g, leader, f2 := tornFollower(t)
	end := f2.Stats().End
	if end <= 2 || end >= 6 {
		t.Fatalf("after the power loss the follower's log ends at %d, want inside the command (2..5)", end)
	}
	// Its retention runs before its group applies the log again: every message is past
	// the retention period (the node was down longer than it).
	if _, err := f2.EnforceRetention(WallMillis() + 3_600_000); err != nil {
		t.Fatal(err)
	}
	rejoin(g, leader, f2)
	appendN(t, leader, 3) // offsets 6..8
	if l, f := leader.Stats().End, f2.Stats().End; f != l {
		t.Errorf("after applying the whole group log the follower's log ends at %d, the leader's at %d: the replicas diverged for good", f, l)
	}
	recs, err := f2.Read(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := leader.Read(0, 100)
	if len(recs) != len(want) {
		t.Fatalf("the follower holds %d records, the leader %d", len(recs), len(want))
	}
	for i := range recs {
		if recs[i].Offset != want[i].Offset || string(recs[i].Value) != string(want[i].Value) {
			t.Fatalf("record %d: follower %d %q, leader %d %q", i, recs[i].Offset, recs[i].Value, want[i].Offset, want[i].Value)
		}
	}

	// Once it applied the command that reaches its log's end, retention runs as ever.
	if n, err := f2.EnforceRetention(WallMillis() + 3_600_000); err != nil || n == 0 {
		t.Fatalf("retention after the group's log was applied again removed %d records (%v), want all", n, err)
	}
}

// retainFirst is a member that runs before (when set) just before it proposes a command
// of kind (a settle by default): retention passing the messages a command is about.
type retainFirst struct {
	member
	before *func()
	kind   byte
}

func (m retainFirst) Propose(ctx context.Context, cmd []byte, submitted func()) (any, error) {
	kind := m.kind
	if kind == 0 {
		kind = cmdSettle
	}
	if f := *m.before; f != nil && len(cmd) > 0 && cmd[0] == kind {
		f()
	}
	return m.member.Propose(ctx, cmd, submitted)
}

// TestAnAckRetentionOvertookEndsItsLease: retention removed the messages whose acks
// were being committed (their leases pinned by the acks). The acks are answered 204,
// and their leases end: on the old code the settle command found the offsets settled
// already (aged out) and ended nothing, so each lease held an in-flight slot until the
// next change of leader, and enough of them (a backlog acked at the retention's edge)
// stopped the partition from delivering anything.
func TestAnAckRetentionOvertookEndsItsLease(t *testing.T) {
	var before func()
	_, ps := openGroupWith(t, 2, func(m member) Group { return retainFirst{member: m, before: &before} })
	lead := ps[0]
	cfg := lead.Config()
	cfg.MaxInFlight = 3
	lead.SetConfig(cfg)
	appendN(t, lead, 3)
	ds := leaseAll(t, lead)
	if len(ds) != 3 {
		t.Fatalf("leased %d, want 3", len(ds))
	}
	before = func() {
		before = nil
		if n, err := lead.EnforceRetention(WallMillis() + 3_600_000); err != nil || n != 3 {
			t.Errorf("retention removed %d (%v), want 3", n, err)
		}
	}
	var reqs []SettleReq
	for _, d := range ds {
		reqs = append(reqs, SettleReq{Offset: d.Record.Offset, Nonce: d.Nonce})
	}
	for i, err := range lead.Settle(reqs) {
		if err != nil {
			t.Errorf("ack of offset %d: %v", reqs[i].Offset, err)
		}
	}
	if st := lead.Stats(); st.InFlight != 0 {
		t.Errorf("%d leases still held after their acks were answered", st.InFlight)
	}
	appendN(t, lead, 1) // offset 3
	got, err := lead.Lease(10, time.Minute, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Record.Offset != 3 {
		t.Fatalf("a consume after the acks leased %d messages, want offset 3 (the in-flight cap is 3)", len(got))
	}
}

// TestRetentionForgetsTheDeliveryCountsOfWhatItRemoved: the committed delivery counts of
// messages delivered more than once (D commands) are kept on every replica until the
// message is settled, and ride in every snapshot. A message that aged out is settled
// for good; its count must go with it. On the old code only an ack's settle command
// (or leading) dropped a count: a poison message nacked until it aged out left its
// count on every replica and in every snapshot for as long as the leader led.
func TestRetentionForgetsTheDeliveryCountsOfWhatItRemoved(t *testing.T) {
	_, ps := openGroup(t, 2)
	appendN(t, ps[0], 1)
	for range 2 { // delivered twice: the second delivery's count is committed
		ds := leaseAll(t, ps[0])
		if len(ds) != 1 {
			t.Fatalf("leased %d, want 1", len(ds))
		}
		if err := ps[0].Extend(ds[0].Record.Offset, ds[0].Nonce, 0); err != nil { // a nack
			t.Fatal(err)
		}
	}
	for i, p := range ps {
		if n, err := p.EnforceRetention(WallMillis() + 3_600_000); err != nil || n != 1 {
			t.Fatalf("replica %d: retention removed %d (%v), want 1", i, n, err)
		}
		data, err := p.SnapshotState()
		if err != nil {
			t.Fatal(err)
		}
		if st, err := decodeSnapState(data); err != nil || len(st.attempts) != 0 {
			t.Errorf("replica %d: snapshot delivery counts %v (%v) after the message aged out, want none", i, st.attempts, err)
		}
	}
}

// TestRetentionOnAClosedPartitionSaysClosed: the retention pass may reach a partition
// closed under it (its topic deleted, its replica moved off the node). The broker
// passes over ErrClosed; on the old code the log's own "closed" came back instead, and
// was logged at ERROR as a failed retention.
func TestRetentionOnAClosedPartitionSaysClosed(t *testing.T) {
	p := mustOpen(t, vfs.NewMem())
	appendN(t, p, 2)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.EnforceRetention(WallMillis() + 3_600_000); !errors.Is(err, ErrClosed) {
		t.Fatalf("retention on a closed partition: %v, want ErrClosed", err)
	}
}

// TestARestoringReplicaAgesOutWhatItHeld: a replica that knows nothing yet of its
// group's history (its log holds records from before it went down, no snapshot of
// its own) must restore the group's snapshot, and every message its peers held since
// aged out there. Its own old records stand in the way (no gap is written) until its
// retention removes them; the snapshot replaces the entries that could have torn them,
// so retention runs during the restore. (With retention held until the replica applied
// the command reaching its log's end, as first fixed, the restore waited for ever.)
func TestARestoringReplicaAgesOutWhatItHeld(t *testing.T) {
	g, lead := snapLeader(t)
	data, err := lead.SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lead.EnforceRetention(WallMillis() + 3_600_000); err != nil {
		t.Fatal(err)
	}
	p := mustOpen(t, vfs.NewMem(), func(o *Options) { o.Group = member{g: g, i: 1} })
	t.Cleanup(func() { _ = p.Close() })
	if _, err := p.log.Append([]segment.Record{{Value: []byte("v0"), Timestamp: 1}, {Value: []byte("v1"), Timestamp: 1}}); err != nil {
		t.Fatal(err)
	}
	fetch := func(_ context.Context, from uint64) ([]segment.Record, error) { return lead.ReplicaRead(from, 100) }
	ctx := context.Background()
	if err := p.RestoreSnapshot(ctx, 40, data, fetch); !errors.Is(err, ErrSnapshotSource) {
		t.Fatalf("restore over old records its source no longer holds: %v, want ErrSnapshotSource until they age out here", err)
	}
	if _, err := p.EnforceRetention(WallMillis() + 3_600_000); err != nil {
		t.Fatal(err)
	}
	if err := p.RestoreSnapshot(ctx, 40, data, fetch); err != nil {
		t.Fatalf("restore once this replica's old records aged out: %v", err)
	}
	if o, n := p.log.Oldest(), p.log.Next(); o != 30 || n != 30 {
		t.Fatalf("the restored log holds [%d, %d), want [30, 30)", o, n)
	}
}

// TestLeasesRetentionRemovedWhileConfirmingAreNotLate: retention removed messages whose
// leases were being confirmed by the replicas (the consume's D command). They are gone,
// not handed out and not coming back; on the old code they were counted and logged as
// leases whose confirmation outlasted the visibility timeout (a stalled group, says the
// metric's documentation), with a negative "late by".
func TestLeasesRetentionRemovedWhileConfirmingAreNotLate(t *testing.T) {
	var before func()
	late := 0
	g := &fakeGroup{}
	p := mustOpen(t, vfs.NewMem(), func(o *Options) {
		o.Group = retainFirst{member: member{g: g, i: 0}, before: &before, kind: cmdDelivered}
		o.OnLateLeases = func(n int) { late += n }
	})
	t.Cleanup(func() { _ = p.Close() })
	g.replicas = []*Partition{p}
	p.SetRole(true, 1)
	appendN(t, p, 2)
	before = func() {
		before = nil
		if n, err := p.EnforceRetention(WallMillis() + 3_600_000); err != nil || n != 2 {
			t.Errorf("retention removed %d (%v), want 2", n, err)
		}
	}
	ds, err := p.Lease(10, time.Minute, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 0 {
		t.Fatalf("delivered %d messages retention removed", len(ds))
	}
	if late != 0 {
		t.Errorf("%d leases counted as confirmed too late; their messages aged out", late)
	}
}
