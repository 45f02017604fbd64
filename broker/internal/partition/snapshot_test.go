package partition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// snapLeader is a replicated leader holding 30 messages with offsets 0–9, 15 and 20
// settled.
func snapLeader(t *testing.T) (*fakeGroup, *Partition) {
	t.Helper()
	g, ps := openGroup(t, 1)
	for i := range 30 {
		if _, err := ps[0].Append([]segment.Record{{Key: []byte(fmt.Sprint("k", i%3)), Value: []byte(fmt.Sprint("v", i))}}); err != nil {
			t.Fatal(err)
		}
	}
	ds := leaseAll(t, ps[0])
	var reqs []SettleReq
	for _, d := range ds {
		if o := d.Record.Offset; o < 10 || o == 15 || o == 20 {
			reqs = append(reqs, SettleReq{Offset: o, Nonce: d.Nonce})
		}
	}
	for _, err := range ps[0].Settle(reqs) {
		if err != nil {
			t.Fatal(err)
		}
	}
	return g, ps[0]
}

// fetchFrom reads from src in runs of at most n records.
func fetchFrom(src *Partition, n int) Fetch {
	return func(_ context.Context, from uint64) ([]segment.Record, error) {
		recs, err := src.Read(from, n)
		// Read's records share buffers with the next read: copy, as the wire does.
		out := make([]segment.Record, len(recs))
		for i, r := range recs {
			out[i] = r
			out[i].Key, out[i].Value = slices.Clone(r.Key), slices.Clone(r.Value)
		}
		return out, err
	}
}

func sameState(t *testing.T, what string, got, want *Partition) {
	t.Helper()
	g, err := got.Read(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	w, err := want.Read(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(g) != len(w) {
		t.Fatalf("%s: %d records, want %d", what, len(g), len(w))
	}
	for i := range g {
		if g[i].Offset != w[i].Offset || g[i].Timestamp != w[i].Timestamp || string(g[i].Key) != string(w[i].Key) || string(g[i].Value) != string(w[i].Value) {
			t.Fatalf("%s: record %d = %+v, want %+v", what, i, g[i], w[i])
		}
	}
	if gs, ws := got.Stats(), want.Stats(); gs.Frontier != ws.Frontier || gs.AckedAhead != ws.AckedAhead {
		t.Fatalf("%s: frontier %d acked-ahead %d, want %d and %d", what, gs.Frontier, gs.AckedAhead, ws.Frontier, ws.AckedAhead)
	}
	a, b := got.q.AckedAhead(), want.q.AckedAhead()
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) {
		t.Fatalf("%s: acked ahead %v, want %v", what, a, b)
	}
}

// TestRestoreSnapshotIntoEmptyReplica: an empty replica restored from a leader's
// snapshot holds the same records (offsets, timestamps, keys, values) and the same
// settlements, durably: a power loss right after the restore loses none of it, and a
// second restore fetches nothing.
func TestRestoreSnapshotIntoEmptyReplica(t *testing.T) {
	g, lead := snapLeader(t)
	data, err := lead.SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	fs := vfs.NewMem()
	open := func() *Partition {
		return mustOpen(t, fs, func(o *Options) { o.Group = member{g: g, i: 1} })
	}
	p := open()
	if err := p.RestoreSnapshot(context.Background(), 40, data, fetchFrom(lead, 7)); err != nil {
		t.Fatal(err)
	}
	sameState(t, "after the restore", p, lead)
	if got := p.OffsetAtIndex(40); got != 30 {
		t.Fatalf("the restore marked index 40 at offset %d, want 30", got)
	}
	fs.Crash() // everything unsynced is gone, on every file
	_ = p.Close()
	p = open()
	t.Cleanup(func() { _ = p.Close() })
	sameState(t, "after a power loss", p, lead)
	never := func(context.Context, uint64) ([]segment.Record, error) {
		t.Fatal("a replica holding the snapshot's state fetched records")
		return nil, nil
	}
	if err := p.RestoreSnapshot(context.Background(), 40, data, never); err != nil {
		t.Fatal(err)
	}
	sameState(t, "after a second restore", p, lead)
}

// TestRestoreSnapshotCutShort: a restore whose source fails after one run of records
// leaves a replica that a power loss takes back to some prefix; the next restore
// (the group retries it, also after a restart) completes it.
func TestRestoreSnapshotCutShort(t *testing.T) {
	g, lead := snapLeader(t)
	data, err := lead.SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	fs := vfs.NewMem()
	p := mustOpen(t, fs, func(o *Options) { o.Group = member{g: g, i: 1} })
	calls := 0
	flaky := func(ctx context.Context, from uint64) ([]segment.Record, error) {
		calls++
		if calls > 1 {
			return nil, ErrSnapshotSource
		}
		return fetchFrom(lead, 8)(ctx, from)
	}
	if err := p.RestoreSnapshot(context.Background(), 40, data, flaky); !errors.Is(err, ErrSnapshotSource) {
		t.Fatalf("restore with a failing source: %v, want ErrSnapshotSource", err)
	}
	fs.Crash()
	_ = p.Close()
	p = mustOpen(t, fs, func(o *Options) { o.Group = member{g: g, i: 1} })
	t.Cleanup(func() { _ = p.Close() })
	if err := p.RestoreSnapshot(context.Background(), 40, data, fetchFrom(lead, 8)); err != nil {
		t.Fatal(err)
	}
	sameState(t, "after the second restore", p, lead)
}

// TestRestoreSnapshotAfterRetention: when the group's messages before some offset
// aged out, an empty replica starts its log at the snapshot's oldest offset, or at
// the oldest its source still holds, and never writes a gap into its log.
func TestRestoreSnapshotAfterRetention(t *testing.T) {
	g, lead := snapLeader(t)
	s := snapState{oldest: 12, end: 30, frontier: 10, ackedAhead: []uint64{15, 20}}
	for _, tc := range []struct {
		name      string
		srcOldest uint64
		wantFirst uint64
	}{{"snapshot's oldest", 12, 12}, {"source's oldest", 14, 14}} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustOpen(t, vfs.NewMem(), func(o *Options) { o.Group = member{g: g, i: 1} })
			t.Cleanup(func() { _ = p.Close() })
			src := fetchFrom(lead, 100)
			fetch := func(ctx context.Context, from uint64) ([]segment.Record, error) {
				return src(ctx, max(from, tc.srcOldest))
			}
			if err := p.RestoreSnapshot(context.Background(), 40, s.encode(), fetch); err != nil {
				t.Fatal(err)
			}
			recs, err := p.Read(0, 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) == 0 || recs[0].Offset != tc.wantFirst || recs[len(recs)-1].Offset != 29 || len(recs) != int(30-tc.wantFirst) {
				t.Fatalf("restored log holds %d records from %d, want %d from %d", len(recs), recs[0].Offset, 30-tc.wantFirst, tc.wantFirst)
			}
		})
	}
	// A replica whose own records end before the source's oldest cannot take the
	// records after a gap: the restore fails (another source may have them).
	p := mustOpen(t, vfs.NewMem(), func(o *Options) { o.Group = member{g: g, i: 1} })
	t.Cleanup(func() { _ = p.Close() })
	if _, err := p.log.Append([]segment.Record{{Value: []byte("v0")}, {Value: []byte("v1")}}); err != nil {
		t.Fatal(err)
	}
	src := fetchFrom(lead, 100)
	gap := func(ctx context.Context, from uint64) ([]segment.Record, error) { return src(ctx, max(from, 14)) }
	if err := p.RestoreSnapshot(context.Background(), 40, s.encode(), gap); !errors.Is(err, ErrSnapshotSource) {
		t.Fatalf("restore across a gap: %v, want ErrSnapshotSource", err)
	}
	if p.log.Next() != 2 {
		t.Fatalf("the refused restore wrote records: log ends at %d", p.log.Next())
	}
}

// TestSnapshotStateRoundTrip: what SnapshotState writes decodes to the state, and a
// damaged snapshot is refused.
func TestSnapshotStateRoundTrip(t *testing.T) {
	_, lead := snapLeader(t)
	data, err := lead.SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	s, err := decodeSnapState(data)
	if err != nil {
		t.Fatal(err)
	}
	if s.oldest != 0 || s.end != 30 || s.frontier != 10 || !slices.Equal(s.ackedAhead, []uint64{15, 20}) {
		t.Fatalf("snapshot state %+v", s)
	}
	for _, bad := range [][]byte{nil, data[:len(data)-1], append([]byte{'X'}, data[1:]...), append([]byte{'P', 9}, data[2:]...)} {
		if _, err := decodeSnapState(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decoding %x: %v, want ErrCorrupt", bad, err)
		}
	}
}

// TestReplicaPowerLossOnEveryReplica: replicas write their message log and journal
// without their own fsync. A power loss on every replica at once takes what they wrote
// since their last snapshot; each reopened replica that restores its own snapshot
// (fetching nothing) and applies the group's durable log after it holds the leader's
// records and settlements again.
func TestReplicaPowerLossOnEveryReplica(t *testing.T) {
	g := &fakeGroup{}
	var fss []*vfs.Mem
	for i := range 3 {
		fs := vfs.NewMem()
		fss = append(fss, fs)
		g.replicas = append(g.replicas, mustOpen(t, fs, func(o *Options) { o.Group = member{g: g, i: i} }))
	}
	lead := g.replicas[0]
	lead.SetRole(true, 1)
	settle := func(keep func(uint64) bool) {
		var reqs []SettleReq
		for _, d := range leaseAll(t, lead) {
			if keep(d.Record.Offset) {
				reqs = append(reqs, SettleReq{Offset: d.Record.Offset, Nonce: d.Nonce})
			} else if err := lead.HandBack(d.Record.Offset, d.Nonce); err != nil {
				t.Fatal(err)
			}
		}
		for _, err := range lead.Settle(reqs) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	appendN(t, lead, 40)
	settle(func(o uint64) bool { return o%2 == 0 })
	snapIdx := uint64(len(g.log))
	snaps := make([][]byte, 3)
	for i, p := range g.replicas {
		var err error
		if snaps[i], err = p.SnapshotState(); err != nil {
			t.Fatal(err)
		}
	}
	appendN(t, lead, 40)
	settle(func(o uint64) bool { return o < 20 || o%3 == 0 })
	wantRecs, err := fetchFrom(lead, 200)(context.Background(), 0)
	if err != nil || len(wantRecs) != 80 {
		t.Fatalf("leader holds %d records: %v", len(wantRecs), err)
	}
	wantStats, wantAcked := lead.Stats(), lead.q.AckedAhead()
	slices.Sort(wantAcked)
	for _, fs := range fss {
		fs.Crash()
	}
	lost := false
	never := func(context.Context, uint64) ([]segment.Record, error) {
		t.Fatal("a replica restoring its own snapshot fetched records")
		return nil, nil
	}
	for i, fs := range fss {
		p := mustOpen(t, fs, func(o *Options) { o.Group = member{g: g, i: i} })
		t.Cleanup(func() { _ = p.Close() })
		lost = lost || p.log.Next() < 80 || p.Stats().Frontier < wantStats.Frontier || p.Stats().AckedAhead < wantStats.AckedAhead
		if err := p.RestoreSnapshot(context.Background(), snapIdx, snaps[i], never); err != nil {
			t.Fatal(err)
		}
		for idx := snapIdx + 1; idx <= uint64(len(g.log)); idx++ {
			p.Apply(idx, g.log[idx-1])
		}
		got, err := p.Read(0, 200)
		if err != nil || len(got) != len(wantRecs) {
			t.Fatalf("replica %d holds %d records after the replay, want %d: %v", i, len(got), len(wantRecs), err)
		}
		for j := range got {
			if got[j].Offset != wantRecs[j].Offset || got[j].Timestamp != wantRecs[j].Timestamp || string(got[j].Value) != string(wantRecs[j].Value) {
				t.Fatalf("replica %d record %d = %+v, want %+v", i, j, got[j], wantRecs[j])
			}
		}
		acked := p.q.AckedAhead()
		slices.Sort(acked)
		if st := p.Stats(); st.Frontier != wantStats.Frontier || !slices.Equal(acked, wantAcked) {
			t.Fatalf("replica %d: frontier %d acked-ahead %v after the replay, want %d and %v", i, st.Frontier, acked, wantStats.Frontier, wantAcked)
		}
	}
	if !lost {
		t.Fatal("the power loss took nothing from any replica: the test cannot tell the replay's work")
	}
}

// TestFanoutCursorReplicated: a committed fan-out cursor reaches every replica, only
// moves forward, rides in the snapshot, and a restored replica takes it.
func TestFanoutCursorReplicated(t *testing.T) {
	g, ps := openGroup(t, 2)
	appendN(t, ps[0], 10)
	ctx := context.Background()
	if err := ps[1].CommitFanoutCursor(ctx, 7, 4); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a follower committed a fan-out cursor: %v", err)
	}
	for _, next := range []uint64{4, 9, 6} {
		if err := ps[0].CommitFanoutCursor(ctx, 7, next); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range ps {
		if got := p.FanoutCursor(7); got != 9 {
			t.Fatalf("replica %d holds fan-out cursor %d for attach 7, want 9 (it never moves back)", i, got)
		}
		if got := p.FanoutCursor(8); got != 0 {
			t.Fatalf("replica %d holds a cursor %d for an attach never committed", i, got)
		}
	}
	data, err := ps[0].SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	s, err := decodeSnapState(data)
	if err != nil || len(s.fanout) != 1 || s.fanout[0] != [2]uint64{7, 9} {
		t.Fatalf("snapshot fan-out cursors %v: %v", s.fanout, err)
	}
	p := mustOpen(t, vfs.NewMem(), func(o *Options) { o.Group = member{g: g, i: 2} })
	t.Cleanup(func() { _ = p.Close() })
	if err := p.RestoreSnapshot(ctx, uint64(len(g.log)), data, fetchFrom(ps[0], 100)); err != nil {
		t.Fatal(err)
	}
	if got := p.FanoutCursor(7); got != 9 {
		t.Fatalf("the restored replica holds fan-out cursor %d, want 9", got)
	}
}

// TestRestoreSnapshotWhoseMessagesAllAgedOut: when every message of a snapshot (and
// every one after it) aged out on the replica fetched from, an empty replica restoring
// the snapshot starts its log at the snapshot's end instead of asking for them for
// ever: the source says they aged out (ReplicaRead), which an empty answer did not.
func TestRestoreSnapshotWhoseMessagesAllAgedOut(t *testing.T) {
	g, lead := snapLeader(t)
	data, err := lead.SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	// Ten more messages after the snapshot, then all forty age out at the source.
	for i := range 10 {
		if _, err := lead.Append([]segment.Record{{Value: []byte(fmt.Sprint("w", i))}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := lead.EnforceRetention(WallMillis() + 3_600_000); err != nil {
		t.Fatal(err)
	}
	if recs, _ := lead.Read(0, 100); len(recs) != 0 {
		t.Fatalf("the source still holds %d records after retention", len(recs))
	}
	p := mustOpen(t, vfs.NewMem(), func(o *Options) { o.Group = member{g: g, i: 1} })
	t.Cleanup(func() { _ = p.Close() })
	fetch := func(_ context.Context, from uint64) ([]segment.Record, error) { return lead.ReplicaRead(from, 100) }
	if err := p.RestoreSnapshot(context.Background(), 40, data, fetch); err != nil {
		t.Fatalf("restore of a snapshot whose messages aged out everywhere: %v", err)
	}
	// At the snapshot's end, not the source's: the group's entries after the snapshot
	// write the messages from there.
	if o, n := p.log.Oldest(), p.log.Next(); o != 30 || n != 30 {
		t.Fatalf("the restored log holds [%d, %d), want [30, 30)", o, n)
	}
	if st := p.Stats(); st.Frontier != 30 || st.Backlog != 0 {
		t.Fatalf("restored replica: frontier %d backlog %d, want 30 and 0", st.Frontier, st.Backlog)
	}
	// A source that holds the records, or has not reached them, says nothing of the kind.
	if _, err := lead.ReplicaRead(40, 10); err != nil {
		t.Fatalf("a read at the source's end: %v", err)
	}
}
