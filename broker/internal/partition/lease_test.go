package partition

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// leasingMember is a member whose group says whether its leader holds a leader lease.
type leasingMember struct {
	member
	held *atomic.Bool
}

func (m leasingMember) LeaseHeld() bool { return m.held.Load() && m.g.lead == m.i }

func (m leasingMember) LeaseValid() bool { return m.LeaseHeld() }

func openLeasingGroup(t *testing.T, n int) (*fakeGroup, []*Partition, *atomic.Bool) {
	t.Helper()
	g := &fakeGroup{}
	held := &atomic.Bool{}
	for i := range n {
		p := mustOpen(t, vfs.NewMem(), func(o *Options) { o.Group = leasingMember{member{g: g, i: i}, held} })
		t.Cleanup(func() { _ = p.Close() })
		g.replicas = append(g.replicas, p)
	}
	g.replicas[0].SetRole(true, 1)
	return g, g.replicas, held
}

// moveLead makes replica to the leader in term (the old one steps down first).
func (g *fakeGroup) moveLead(to int, term uint64) {
	g.mu.Lock()
	old := g.lead
	g.lead = to
	g.mu.Unlock()
	g.replicas[old].SetRole(false, 0)
	g.replicas[to].SetRole(true, term)
}

// leaseSettled leases n from p and waits for its reservation in the background.
func leaseSettled(t *testing.T, p *Partition, n int) []Delivery {
	t.Helper()
	ds, err := p.Lease(n, time.Minute, 1<<20)
	if err != nil || len(ds) != n {
		t.Fatalf("leased %d: %v", len(ds), err)
	}
	for p.repl.reserving.Load() {
		time.Sleep(time.Millisecond)
	}
	return ds
}

func (g *fakeGroup) commands() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.log)
}

// TestALeaseServesConsumesWithoutACommit: under a leader lease, first deliveries below
// the committed mark are served without a commit of their own (the first consume
// commits the mark ahead of the cursor); a redelivery still commits its count; without
// the lease every consume commits as before; and after a failover the next leader
// counts every message below the mark as delivered once.
func TestALeaseServesConsumesWithoutACommit(t *testing.T) {
	g, ps, held := openLeasingGroup(t, 3)
	appendN(t, ps[0], 10)
	held.Store(true)
	before := g.commands()
	first, err := ps[0].Lease(2, time.Minute, 1<<20)
	if err != nil || len(first) != 2 {
		t.Fatalf("leased %d: %v", len(first), err)
	}
	if got := g.commands() - before; got != 1 {
		t.Fatalf("the first consume committed %d commands, want 1 (the mark, reserved ahead)", got)
	}
	poll := func() {
		// reserveAhead runs in the background: wait until it is idle.
		for ps[0].repl.reserving.Load() {
			time.Sleep(time.Millisecond)
		}
	}
	poll()
	before = g.commands()
	for range 3 {
		if ds, err := ps[0].Lease(2, time.Minute, 1<<20); err != nil || len(ds) != 2 {
			t.Fatalf("leased %d: %v", len(ds), err)
		}
	}
	poll()
	if got := g.commands() - before; got != 0 {
		t.Fatalf("consumes under the lease committed %d commands, want 0", got)
	}
	// A message handed back comes again with attempt 2: that count is committed.
	if err := ps[0].Extend(first[0].Record.Offset, first[0].Nonce, 0); err != nil {
		t.Fatal(err)
	}
	before = g.commands()
	again, err := ps[0].Lease(1, time.Minute, 1<<20)
	if err != nil || len(again) != 1 || again[0].Attempt != 2 {
		t.Fatalf("redelivered %+v: %v", again, err)
	}
	if got := g.commands() - before; got != 1 {
		t.Fatalf("a redelivery committed %d commands, want 1", got)
	}
	// Without the lease, every consume commits.
	held.Store(false)
	before = g.commands()
	if ds, err := ps[0].Lease(1, time.Minute, 1<<20); err != nil || len(ds) != 1 {
		t.Fatalf("leased %d: %v", len(ds), err)
	}
	if got := g.commands() - before; got != 1 {
		t.Fatalf("a consume without the lease committed %d commands, want 1", got)
	}
	// A failover: the next leader counts on for every message delivered (and, the
	// price of the reservation, for the one never delivered below the mark).
	g.moveLead(1, 2)
	rest := leaseAll(t, ps[1])
	if len(rest) != 10 {
		t.Fatalf("the new leader leased %d, want all 10 (leases died with the old one)", len(rest))
	}
	for _, d := range rest {
		if d.Attempt < 2 {
			t.Fatalf("offset %d delivered before the failover comes with attempt %d", d.Record.Offset, d.Attempt)
		}
	}
}

// TestAHandoverCountsExactlyAfterAReservation: a planned change of leader after
// consumes under a lease counts only what was delivered: the handover's mark replaces
// the one reserved ahead.
func TestAHandoverCountsExactlyAfterAReservation(t *testing.T) {
	g, ps, held := openLeasingGroup(t, 3)
	appendN(t, ps[0], 5)
	held.Store(true)
	leaseSettled(t, ps[0], 2)
	if err := ps[0].HandOver(context.Background()); err != nil {
		t.Fatal(err)
	}
	g.moveLead(1, 2)
	for _, d := range leaseAll(t, ps[1]) {
		if d.Attempt != 1 {
			t.Fatalf("offset %d never delivered shows attempt %d after a handover", d.Record.Offset, d.Attempt)
		}
	}
}

// TestAReservedMarkCoversNoLaterLeadersAppends: a mark reserved past the log's end by
// one leader does not count the messages a later leader appended as delivered: the
// second leader cuts the mark back before anything of its own, so a third delivers
// them with attempt 1 (the review's two-failover case: they came with attempt 2, and
// an SDK with max_deliveries 1 would have dead-lettered them unseen).
func TestAReservedMarkCoversNoLaterLeadersAppends(t *testing.T) {
	g, ps, held := openLeasingGroup(t, 3)
	appendN(t, ps[0], 4)
	held.Store(true)
	leaseSettled(t, ps[0], 4)
	if m := ps[2].repl.deliveredTo.Load(); m <= 4 {
		t.Fatalf("the mark %d was not reserved past the log's end", m)
	}
	g.moveLead(1, 2)
	appendN(t, ps[1], 3) // offsets 4, 5, 6: never delivered
	g.moveLead(2, 3)
	for _, d := range leaseAll(t, ps[2]) {
		if d.Record.Offset >= 4 && d.Attempt != 1 {
			t.Fatalf("offset %d, appended by the second leader and never delivered, comes with attempt %d", d.Record.Offset, d.Attempt)
		}
		if d.Record.Offset < 4 && d.Attempt < 2 {
			t.Fatalf("offset %d, delivered by the first leader, comes with attempt %d", d.Record.Offset, d.Attempt)
		}
	}
}

// gatedMember holds back its D commands until gate is closed.
type gatedMember struct {
	leasingMember
	gate chan struct{}
}

func (m gatedMember) Propose(ctx context.Context, cmd []byte, submitted func()) (any, error) {
	if len(cmd) > 0 && cmd[0] == cmdDelivered {
		<-m.gate
	}
	return m.leasingMember.Propose(ctx, cmd, submitted)
}

// TestAHandoverWaitsForAConsumesMark: a consume granted before a handover began, whose
// D command (its mark reserved ahead) is still on its way, goes into the log before the
// handover's exact mark; after it, the successor counted never-delivered messages as
// delivered once.
func TestAHandoverWaitsForAConsumesMark(t *testing.T) {
	g := &fakeGroup{}
	held := &atomic.Bool{}
	gate := make(chan struct{})
	var ps []*Partition
	for i := range 3 {
		p := mustOpen(t, vfs.NewMem(), func(o *Options) {
			o.Group = gatedMember{leasingMember{member{g: g, i: i}, held}, gate}
		})
		t.Cleanup(func() { _ = p.Close() })
		ps = append(ps, p)
	}
	g.replicas = ps
	ps[0].SetRole(true, 1)
	appendN(t, ps[0], 6)
	consumed := make(chan error, 1)
	go func() {
		_, err := ps[0].Lease(2, time.Minute, 1<<20) // its D waits at the gate
		consumed <- err
	}()
	for ps[0].repl.confirming.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	handed := make(chan error, 1)
	go func() { handed <- ps[0].HandOver(context.Background()) }()
	time.Sleep(20 * time.Millisecond) // let HandOver reach its wait: the order under test
	close(gate)
	if err := <-consumed; err != nil {
		t.Fatal(err)
	}
	if err := <-handed; err != nil {
		t.Fatal(err)
	}
	g.moveLead(1, 2)
	for _, d := range leaseAll(t, ps[1]) {
		if d.Record.Offset >= 2 && d.Attempt != 1 {
			t.Fatalf("offset %d, never delivered, comes with attempt %d after a handover", d.Record.Offset, d.Attempt)
		}
	}
}

// refusingMember refuses mark commands, as raft does during a leadership transfer.
type refusingMember struct{ leasingMember }

func (m refusingMember) Propose(ctx context.Context, cmd []byte, submitted func()) (any, error) {
	if len(cmd) > 0 && cmd[0] == cmdMark {
		return nil, ErrNotLeader
	}
	return m.leasingMember.Propose(ctx, cmd, submitted)
}

// TestANewLeaderWhoseMarkIsRefusedServesAtOnce: a new leader whose mark command raft
// refused does not wait out the replicate timeout on its group's apply goroutine (the
// group's loop stood still for 5 s) and serves, without its lease for the term.
func TestANewLeaderWhoseMarkIsRefusedServesAtOnce(t *testing.T) {
	g := &fakeGroup{}
	held := &atomic.Bool{}
	held.Store(true)
	p := mustOpen(t, vfs.NewMem(), func(o *Options) { o.Group = refusingMember{leasingMember{member{g: g, i: 0}, held}} })
	t.Cleanup(func() { _ = p.Close() })
	g.replicas = []*Partition{p}
	start := time.Now()
	p.SetRole(true, 1)
	if d := time.Since(start); d > replicateTimeout/2 {
		t.Fatalf("SetRole took %v after its mark was refused", d)
	}
	if !p.Leading() || p.leasesAllowed() {
		t.Fatalf("leading %v, lease allowed %v: want it leading without its lease", p.Leading(), p.leasesAllowed())
	}
	appendN(t, p, 2)
	if ds, err := p.Lease(2, time.Minute, 1<<20); err != nil || len(ds) != 2 {
		t.Fatalf("leased %d: %v", len(ds), err)
	}
}

// clockedGateMember is a leasingMember whose D command, while armed, waits at gate and
// then moves the test clock by step: a consume's confirmation that takes that long (a
// leader's disk stalling).
type clockedGateMember struct {
	leasingMember
	armed *atomic.Bool
	gate  chan struct{}
	clock *atomic.Int64
	step  time.Duration
}

func (m clockedGateMember) Propose(ctx context.Context, cmd []byte, submitted func()) (any, error) {
	if len(cmd) > 0 && cmd[0] == cmdDelivered && m.armed.Load() {
		<-m.gate
		m.clock.Add(int64(m.step))
	}
	return m.leasingMember.Propose(ctx, cmd, submitted)
}

// TestAHandoverCountsTimeLeftWhenItProposes: a handover that waits for a consume's
// confirmation (4 s here, as on a stalling disk) hands over each lease's time left as
// of its proposal, not as of the moment it read the leases: the successor counts the
// time left from the command's arrival, and counted from the read, a lease 5 s long
// lived 4 s longer there than its holder was told, and an ack 1 s past its end was
// answered 204 (the cluster chaos run's slowdisk steps found 18).
func TestAHandoverCountsTimeLeftWhenItProposes(t *testing.T) {
	var clock atomic.Int64
	clock.Store(int64(time.Hour))
	g := &fakeGroup{}
	held, armed := &atomic.Bool{}, &atomic.Bool{}
	gate := make(chan struct{})
	var ps []*Partition
	for i := range 3 {
		p := mustOpen(t, vfs.NewMem(), func(o *Options) {
			o.Group = clockedGateMember{leasingMember{member{g: g, i: i}, held}, armed, gate, &clock, 4 * time.Second}
			o.Clock = clock.Load
		})
		t.Cleanup(func() { _ = p.Close() })
		ps = append(ps, p)
	}
	g.replicas = ps
	ps[0].SetRole(true, 1)
	appendN(t, ps[0], 2)
	first, err := ps[0].Lease(1, 5*time.Second, 1<<20)
	if err != nil || len(first) != 1 {
		t.Fatalf("leased %d: %v", len(first), err)
	}
	for ps[0].repl.reserving.Load() || ps[0].repl.confirming.Load() > 0 {
		time.Sleep(time.Millisecond)
	}
	start := clock.Load()
	armed.Store(true) // the next consume's confirmation waits at the gate
	consumed := make(chan error, 1)
	go func() {
		_, err := ps[0].Lease(1, time.Minute, 1<<20)
		consumed <- err
	}()
	for ps[0].repl.confirming.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	handed := make(chan error, 1)
	go func() { handed <- ps[0].HandOver(context.Background()) }()
	time.Sleep(20 * time.Millisecond) // let HandOver read the leases and wait
	close(gate)                       // the confirmation takes 4 s of the test clock
	if err := <-consumed; err != nil {
		t.Fatal(err)
	}
	if err := <-handed; err != nil {
		t.Fatal(err)
	}
	g.moveLead(1, 2)
	// 6 s after the lease began: its holder was told 5.
	clock.Store(start + int64(6*time.Second))
	errs := ps[1].Settle([]SettleReq{{Offset: first[0].Record.Offset, Nonce: first[0].Nonce}})
	if !errors.Is(errs[0], queue.ErrLeaseLost) {
		t.Fatalf("an ack 1 s after a handed-over lease ended answered %v on the successor; want ErrLeaseLost", errs[0])
	}
}

// TestConfirmLeadingNeedsALeaseOrAConfirmation: a leader answers for what it holds in
// memory (its counters) only while it leads under its lease or its group confirms it
// leads; a follower never; and a leader deposed without being told (paused past its
// election timeout, not yet stepped down) fails it, with or without a lease held
// somewhere in its group. The broker's counters rely on it; before this test only a
// broker test caught a ConfirmLeading that trusted its own flag or leasesAllowed.
func TestConfirmLeadingNeedsALeaseOrAConfirmation(t *testing.T) {
	g, ps, held := openLeasingGroup(t, 2)
	ctx := context.Background()
	for _, lease := range []bool{true, false} {
		held.Store(lease)
		if err := ps[0].ConfirmLeading(ctx); err != nil {
			t.Fatalf("the leader (lease held: %v) could not confirm: %v", lease, err)
		}
		if err := ps[1].ConfirmLeading(ctx); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("a follower (lease held: %v) confirmed it leads: %v", lease, err)
		}
	}
	g.mu.Lock()
	g.lead = 1 // ps[0] is not told
	g.mu.Unlock()
	for _, lease := range []bool{true, false} {
		held.Store(lease)
		if err := ps[0].ConfirmLeading(ctx); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("a leader deposed without being told (a lease held in its group: %v) confirmed it leads: %v", lease, err)
		}
	}
}
