package partition

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// modelGroup is a fake group whose replicas can be down: a proposal is applied at once
// on every replica that is up; a replica brought back applies the log from its last
// snapshot.
type modelGroup struct {
	mu   sync.Mutex
	reps []*Partition
	up   []bool
	lead int
	log  [][]byte
	// applied is how many entries of log were committed (applied); the rest stay
	// in the log uncommitted, their proposers told their outcome is unknown.
	applied int
	lagNext bool
}

// commitPending commits (or, drop, removes) the entries proposed but not committed.
func (g *modelGroup) commitPending(drop bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if drop {
		g.log = g.log[:g.applied]
		return
	}
	for g.applied < len(g.log) {
		g.applied++
		for i, p := range g.reps {
			if g.up[i] {
				p.Apply(uint64(g.applied), g.log[g.applied-1])
			}
		}
	}
}

type modelMember struct {
	g *modelGroup
	i int
}

func (m modelMember) Propose(_ context.Context, cmd []byte, submitted func()) (any, error) {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lead != m.i {
		return nil, ErrNotLeader
	}
	g.log = append(g.log, append([]byte(nil), cmd...))
	if submitted != nil {
		submitted()
	}
	if g.lagNext {
		g.lagNext = false
		return nil, context.DeadlineExceeded
	}
	var mine any
	for g.applied < len(g.log) {
		g.applied++
		for i, p := range g.reps {
			if !g.up[i] {
				continue
			}
			res := p.Apply(uint64(g.applied), g.log[g.applied-1])
			if i == m.i {
				mine = res
			}
		}
	}
	return mine, nil
}

func (m modelMember) Confirm(context.Context) error {
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	if m.g.lead != m.i {
		return ErrNotLeader
	}
	return nil
}

// modelLeasing is a modelMember whose leader holds a leader lease.
type modelLeasing struct{ modelMember }

func (m modelLeasing) LeaseHeld() bool {
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	return m.g.lead == m.i
}

type modelSnap struct {
	data  []byte
	index uint64
}

// TestModelReplicas runs seeded random histories of a group of three replicas:
// appends, consumes, acks and nacks on the leader, changes of leader by election
// (the leader's node going, too) and by a planned handover, proposals left
// uncommitted for a while (stale appends), snapshots (some in the middle of a
// replay), power cuts that tear what was not synced, and restarts from the replica's
// own snapshot or, its data set aside, from the leader's (some cut short by their
// source and a power cut first). After every step each replica must hold the
// leader's messages and settlements; no message acked 204 is delivered again; a
// message's delivery_attempt never goes back; a lease held across a planned handover
// can be acked and nacked. (On the code before the review of 7 December, snapshots
// taken in the middle of a replay left replicas that never held another message.)
func TestModelReplicas(t *testing.T) {
	for seed := int64(1); seed <= modelSeeds; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, seed) })
	}
}

func runModel(t *testing.T, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	const n = 3
	g := &modelGroup{up: make([]bool, n)}
	fss := make([]*vfs.Mem, n)
	snaps := make([]*modelSnap, n)
	leasing := seed%2 == 0
	open := func(i int) *Partition {
		return mustOpen(t, fss[i], func(o *Options) {
			o.Group = modelMember{g: g, i: i}
			if leasing {
				o.Group = modelLeasing{modelMember{g: g, i: i}}
			}
			o.CheckpointEvery = 3
		})
	}
	for i := range n {
		fss[i] = vfs.NewMem()
		g.reps = append(g.reps, open(i))
		g.up[i] = true
	}
	t.Cleanup(func() {
		for i, p := range g.reps {
			if g.up[i] {
				_ = p.Close()
			}
		}
	})
	term := uint64(1)
	g.reps[0].SetRole(true, term)
	acked := map[uint64]bool{}
	lastAttempt := map[uint64]uint32{}
	var held []Delivery
	var trace []string
	logf := func(f string, a ...any) { trace = append(trace, fmt.Sprintf(f, a...)) }
	fail := func(f string, a ...any) {
		t.Helper()
		for _, l := range trace {
			t.Log(l)
		}
		t.Fatalf(f, a...)
	}
	leader := func() *Partition { return g.reps[g.lead] }
	upOthers := func() []int {
		var out []int
		for i := range n {
			if g.up[i] && i != g.lead {
				out = append(out, i)
			}
		}
		return out
	}
	check := func(what string) {
		want, err := leader().Read(0, 1<<20)
		if err != nil {
			fail("%s: leader read: %v", what, err)
		}
		ws := leader().Stats()
		wa := leader().q.AckedAhead()
		slices.Sort(wa)
		for i, p := range g.reps {
			if !g.up[i] || i == g.lead {
				continue
			}
			got, err := p.Read(0, 1<<20)
			if err != nil {
				fail("%s: replica %d read: %v", what, i, err)
			}
			if len(got) != len(want) {
				fail("%s: replica %d holds %d records, the leader %d", what, i, len(got), len(want))
			}
			for j := range got {
				if got[j].Offset != want[j].Offset || string(got[j].Value) != string(want[j].Value) || got[j].Timestamp != want[j].Timestamp {
					fail("%s: replica %d record %d = %d:%s, leader %d:%s", what, i, j, got[j].Offset, got[j].Value, want[j].Offset, want[j].Value)
				}
			}
			st := p.Stats()
			a := p.q.AckedAhead()
			slices.Sort(a)
			if st.Frontier != ws.Frontier || !slices.Equal(a, wa) {
				fail("%s: replica %d frontier %d acked %v, leader %d %v", what, i, st.Frontier, a, ws.Frontier, wa)
			}
		}
	}
	msg := 0
	for step := range 400 {
		switch op := rng.Intn(13); op {
		case 12: // the next proposal stays uncommitted for a while
			g.mu.Lock()
			g.lagNext = true
			g.mu.Unlock()
			logf("%d: the next proposal lags", step)
		case 0, 1, 2: // append
			k := 1 + rng.Intn(3)
			recs := make([]segment.Record, k)
			for j := range recs {
				recs[j] = segment.Record{Value: []byte(fmt.Sprintf("m%d", msg))}
				msg++
			}
			off, err := leader().Append(recs)
			logf("%d: append %d on %d: %d %v", step, k, g.lead, off, err)
			if err != nil && !errors.Is(err, ErrOutcomeUnknown) {
				fail("append: %v", err)
			}
		case 3, 4: // lease
			ds, err := leader().Lease(1+rng.Intn(4), time.Minute, 1<<20)
			for leader().repl.reserving.Load() {
				time.Sleep(time.Millisecond)
			}
			logf("%d: lease on %d: %v %v", step, g.lead, offsets(ds), err)
			if err != nil && !errors.Is(err, ErrOutcomeUnknown) {
				fail("lease: %v", err)
			}
			for _, d := range ds {
				o := d.Record.Offset
				if acked[o] {
					fail("offset %d, settled (acked 204), delivered again (attempt %d)", o, d.Attempt)
				}
				if d.Attempt <= lastAttempt[o] {
					fail("offset %d delivered with attempt %d after attempt %d", o, d.Attempt, lastAttempt[o])
				}
				lastAttempt[o] = d.Attempt
				held = append(held, d)
			}
		case 5, 6: // settle
			if len(held) == 0 {
				continue
			}
			j := rng.Intn(len(held))
			d := held[j]
			held = slices.Delete(held, j, j+1)
			err := leader().Settle([]SettleReq{{Offset: d.Record.Offset, Nonce: d.Nonce}})[0]
			logf("%d: settle %d (nonce %v) on %d: %v", step, d.Record.Offset, d.Nonce, g.lead, err)
			if errors.Is(err, ErrOutcomeUnknown) {
				continue
			}
			if err != nil {
				fail("settle of a lease held (handed over, if the leader changed): %v", err)
			}
			acked[d.Record.Offset] = true
		case 7: // nack
			if len(held) == 0 {
				continue
			}
			j := rng.Intn(len(held))
			d := held[j]
			held = slices.Delete(held, j, j+1)
			if rng.Intn(2) == 0 {
				// A renewal first: the lease stays held.
				err := leader().Extend(d.Record.Offset, d.Nonce, time.Minute)
				logf("%d: renew %d on %d: %v", step, d.Record.Offset, g.lead, err)
				if err != nil && !errors.Is(err, ErrOutcomeUnknown) {
					fail("renewal of a lease held: %v", err)
				}
			}
			err := leader().Extend(d.Record.Offset, d.Nonce, 0)
			logf("%d: nack %d on %d: %v", step, d.Record.Offset, g.lead, err)
			if err != nil && !errors.Is(err, ErrOutcomeUnknown) {
				fail("nack of a lease held: %v", err)
			}
		case 8: // change of leader: election or planned handover
			others := upOthers()
			if len(others) == 0 {
				continue
			}
			to := others[rng.Intn(len(others))]
			planned := rng.Intn(2) == 0
			g.mu.Lock()
			g.lagNext = false
			g.mu.Unlock()
			g.commitPending(!planned && rng.Intn(2) == 0)
			if planned {
				if err := leader().HandOver(context.Background()); err != nil {
					fail("handover: %v", err)
				}
				if rng.Intn(3) == 0 {
					// The transfer does not happen: the leader serves on.
					if err := leader().ResumeAfterHandOver(context.Background()); err != nil {
						fail("resume after handover: %v", err)
					}
					logf("%d: handover on %d called off", step, g.lead)
					continue
				}
				term++
			} else {
				term += uint64(1 + rng.Intn(2))
			}
			old := g.lead
			g.mu.Lock()
			g.lead = to
			g.mu.Unlock()
			g.reps[old].SetRole(false, 0)
			ho := g.reps[to].SetRole(true, term)
			logf("%d: leader %d -> %d term %d planned %v handedOver %v", step, old, to, term, planned, ho)
			if !planned {
				held = nil // the leases are lost with an election
			}
		case 9: // snapshot on some replica
			i := rng.Intn(n)
			if !g.up[i] {
				continue
			}
			g.mu.Lock()
			idx := uint64(g.applied)
			data, err := g.reps[i].SnapshotState()
			g.mu.Unlock()
			logf("%d: snapshot on %d at %d: %v", step, i, idx, err)
			if err == nil {
				snaps[i] = &modelSnap{data: data, index: idx}
			}
		case 10: // crash a follower (power loss, torn)
			others := upOthers()
			if len(others) < 2 {
				continue
			}
			i := others[rng.Intn(len(others))]
			if rng.Intn(3) == 0 {
				// The leader's node goes: another is elected first.
				g.mu.Lock()
				g.lagNext = false
				g.mu.Unlock()
				g.commitPending(rng.Intn(2) == 0)
				old := g.lead
				term += 1
				g.mu.Lock()
				g.lead = i
				g.mu.Unlock()
				g.reps[old].SetRole(false, 0)
				g.reps[i].SetRole(true, term)
				held = nil
				logf("%d: leader %d -> %d term %d (its node goes)", step, old, i, term)
				i = old
			}
			g.mu.Lock()
			g.up[i] = false
			g.mu.Unlock()
			_ = g.reps[i].closeFiles()
			fss[i].CrashTorn(rng)
			logf("%d: crash %d", step, i)
		case 11: // bring a replica back: its own snapshot, or wiped and the leader's
			var down []int
			for i := range n {
				if !g.up[i] {
					down = append(down, i)
				}
			}
			if len(down) == 0 {
				continue
			}
			i := down[rng.Intn(len(down))]
			how := rng.Intn(4) // 0, 1: its own snapshot; 2: the leader's; 3: the leader's, its data set aside
			wipe := how == 3
			var leaderSnap *modelSnap
			if how >= 2 {
				// The group's log was compacted: the leader's snapshot is what it sends.
				g.mu.Lock()
				idx := uint64(g.applied)
				data, err := leader().SnapshotState()
				g.mu.Unlock()
				if err != nil {
					logf("%d: leader snapshot refused: %v", step, err)
					wipe, how = false, 0
				} else {
					leaderSnap = &modelSnap{data: data, index: idx}
				}
			}
			if wipe {
				if err := DiscardData(fss[i], "/p"); err != nil {
					fail("discard: %v", err)
				}
			}
			s := snaps[i]
			if how >= 2 {
				// The group's log was compacted past this replica's: the leader's
				// snapshot is what it is sent.
				s = leaderSnap
			}
			if s != nil && rng.Intn(3) == 0 {
				// A first restore is cut short (its source fails after one run of
				// records) and the node's power goes before the next.
				p := open(i)
				calls := 0
				src := fetchFrom(leader(), 3)
				cut := func(ctx context.Context, from uint64) ([]segment.Record, error) {
					calls++
					if calls > 1 {
						return nil, fmt.Errorf("%w: cut", ErrSnapshotSource)
					}
					return src(ctx, from)
				}
				err := p.RestoreSnapshot(context.Background(), s.index, s.data, cut)
				_ = p.closeFiles()
				fss[i].CrashTorn(rng)
				logf("%d: restore on %d cut short: %v", step, i, err)
			}
			p := open(i)
			g.mu.Lock()
			from := uint64(0)
			if s != nil {
				srcs := append([]int{g.lead}, upOthers()...)
				src := g.reps[srcs[rng.Intn(len(srcs))]]
				if err := p.RestoreSnapshot(context.Background(), s.index, s.data, fetchFrom(src, 5)); err != nil {
					g.mu.Unlock()
					fail("restore on %d: %v", i, err)
				}
				from = s.index
			}
			mid := from + uint64(rng.Intn(g.applied-int(from)+1))
			known := s != nil // the replica knows where its group's history puts the log's end
			for idx := from; idx < uint64(g.applied); idx++ {
				p.Apply(idx+1, g.log[idx])
				known = known || g.log[idx][0] == cmdAppend
				// A snapshot falls due in the middle of the replay. Not before the replay
				// applied an append, with no snapshot restored: raftetcd takes one then
				// only as the owed first snapshot of a group made over data, which the
				// partition cannot tell from a replay over records of later entries (see
				// the report of the review of 7 December).
				if idx+1 == mid && known && rng.Intn(2) == 0 {
					if data, err := p.SnapshotState(); err == nil {
						s = &modelSnap{data: data, index: mid}
						logf("%d: snapshot on %d mid-replay at %d", step, i, mid)
					}
				}
			}
			g.reps[i] = p
			g.up[i] = true
			g.mu.Unlock()
			p.SetRole(false, 0)
			snaps[i] = s
			logf("%d: restart %d how %d from %d failed %v", step, i, how, from, p.Failed())
		}
		check(fmt.Sprintf("after step %d", step))
	}
}

// modelSeeds is how many seeded runs TestModelReplicas makes (about 40 ms each).
var modelSeeds int64 = 60
