package queue

import (
	"errors"
	"math/rand"
	"os"
	"strconv"
	"testing"
	"time"
)

var cfg = Config{Visibility: time.Second, MaxInFlight: 1 << 20, MaxAckedAhead: 1 << 20}

func mustLease(t *testing.T, s *State, now int64, n int) []Grant {
	t.Helper()
	g := s.Lease(now, n)
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	return g
}

func settle(t *testing.T, s *State, g Grant, now int64) error {
	t.Helper()
	if err := s.BeginSettle(g.Offset, g.Nonce, now); err != nil {
		return err
	}
	s.CommitSettle(g.Offset)
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	return nil
}

func TestLeaseAckAdvancesFrontier(t *testing.T) {
	s := New(cfg, 1, 0, nil)
	s.SetBounds(0, 3)
	g := mustLease(t, s, 0, 10)
	if len(g) != 3 || g[0].Offset != 0 || g[2].Offset != 2 || g[0].Attempt != 1 {
		t.Fatalf("grants %+v", g)
	}
	if more := s.Lease(0, 1); more != nil {
		t.Fatalf("leased %v while all are in flight", more)
	}
	if err := settle(t, s, g[2], 1); err != nil {
		t.Fatal(err)
	}
	if s.Frontier() != 0 {
		t.Fatalf("frontier %d, want 0 (offset 0 still in flight)", s.Frontier())
	}
	settle(t, s, g[0], 1)
	settle(t, s, g[1], 1)
	if s.Frontier() != 3 || len(s.AckedAhead()) != 0 {
		t.Fatalf("frontier %d acked ahead %v", s.Frontier(), s.AckedAhead())
	}
	if err := settle(t, s, g[1], 2); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("second settle: %v, want ErrLeaseLost", err)
	}
}

func TestLapsedLeaseRedeliversAndOldHandleIsLost(t *testing.T) {
	s := New(cfg, 1, 0, nil)
	s.SetBounds(0, 1)
	g := mustLease(t, s, 0, 1)[0]
	if d, ok := s.NextDeadline(); !ok || d != int64(time.Second) {
		t.Fatalf("next deadline %d %v", d, ok)
	}
	// An ack at the deadline itself is late: the lease covers [now, deadline).
	if err := s.BeginSettle(g.Offset, g.Nonce, int64(time.Second)); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("ack at deadline: %v", err)
	}
	if n := s.Expire(int64(time.Second)); n != 1 {
		t.Fatalf("expired %d", n)
	}
	g2 := mustLease(t, s, int64(time.Second), 1)
	if len(g2) != 1 || g2[0].Offset != 0 || g2[0].Attempt != 2 || g2[0].Nonce == g.Nonce {
		t.Fatalf("redelivery %+v (first %+v)", g2, g)
	}
	if err := s.Extend(g.Offset, g.Nonce, int64(time.Second), time.Second); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("extend with old handle: %v", err)
	}
	if err := settle(t, s, g2[0], int64(time.Second)+1); err != nil {
		t.Fatal(err)
	}
}

func TestExtendAndNack(t *testing.T) {
	s := New(cfg, 1, 0, nil)
	s.SetBounds(0, 2)
	g := mustLease(t, s, 0, 2)
	if err := s.Extend(g[0].Offset, g[0].Nonce, 900, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := s.Expire(int64(2 * time.Second)); n != 1 {
		t.Fatalf("expired %d, want only the unextended lease", n)
	}
	if err := s.Extend(g[0].Offset, g[0].Nonce, int64(2*time.Second), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.BeginSettle(g[0].Offset, g[0].Nonce, int64(2*time.Second)); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("settle after nack: %v", err)
	}
	again := mustLease(t, s, int64(2*time.Second), 5)
	if len(again) != 2 || again[0].Offset != 0 || again[1].Offset != 1 {
		t.Fatalf("after nack and lapse: %+v", again)
	}
}

func TestInFlightAndAckedAheadCaps(t *testing.T) {
	s := New(Config{Visibility: time.Second, MaxInFlight: 2, MaxAckedAhead: 1}, 1, 0, nil)
	s.SetBounds(0, 10)
	g := mustLease(t, s, 0, 10)
	if len(g) != 2 || !s.InFlightFull() || s.Available() {
		t.Fatalf("grants %d full %v", len(g), s.InFlightFull())
	}
	if err := settle(t, s, g[1], 1); err != nil {
		t.Fatal(err)
	}
	// Offset 2 would be the second past the frontier: not leased while 0 is out.
	if g3 := mustLease(t, s, 1, 10); len(g3) != 0 || s.Available() {
		t.Fatalf("leased %+v past the acked-ahead window", g3)
	}
	// The frontier offset settles, and the window moves on.
	if err := settle(t, s, g[0], 2); err != nil || s.Frontier() != 2 {
		t.Fatalf("err %v frontier %d", err, s.Frontier())
	}
	if g3 := mustLease(t, s, 2, 10); len(g3) != 2 || g3[0].Offset != 2 || g3[1].Offset != 3 {
		t.Fatalf("after the frontier moved: %+v", g3)
	}
}

// TestAckedAheadCapRefusesNoAckOfALeaseGrantedUnderIt: with one slow message at the
// frontier, every later message leased can be acked: a lease goes no further past the
// frontier than the acked-ahead set can hold. Before, leases went up to the in-flight
// cap, the acks past the set's cap were refused, and those messages waited out their
// leases to be delivered again (a drain moved on by one message a lease).
func TestAckedAheadCapRefusesNoAckOfALeaseGrantedUnderIt(t *testing.T) {
	s := New(Config{Visibility: time.Second, MaxInFlight: 8, MaxAckedAhead: 4}, 1, 0, nil)
	s.SetBounds(0, 100)
	g := mustLease(t, s, 0, 100)
	if len(g) != 5 {
		t.Fatalf("leased %d with the frontier at 0 and 4 acks ahead allowed; want 5 (offsets 0 to 4)", len(g))
	}
	for _, x := range g[1:] {
		if err := settle(t, s, x, 1); err != nil {
			t.Fatalf("ack of offset %d, leased under the cap: %v", x.Offset, err)
		}
	}
	if err := settle(t, s, g[0], 1); err != nil || s.Frontier() != 5 {
		t.Fatalf("ack of the frontier: %v, frontier %d; want 5", err, s.Frontier())
	}
	// A cap lowered under leases already granted still refuses what the set cannot hold.
	g = mustLease(t, s, 2, 100)
	s.SetConfig(Config{Visibility: time.Second, MaxInFlight: 8, MaxAckedAhead: 1})
	if err := settle(t, s, g[1], 3); err != nil {
		t.Fatal(err)
	}
	if err := s.BeginSettle(g[2].Offset, g[2].Nonce, 3); !errors.Is(err, ErrAckedAheadFull) {
		t.Fatalf("settle past a full acked-ahead set (cap lowered): %v", err)
	}
	if err := settle(t, s, g[0], 3); err != nil {
		t.Fatal(err)
	}
	if err := settle(t, s, g[2], 3); err != nil || s.Frontier() != g[2].Offset+1 {
		t.Fatalf("err %v frontier %d", err, s.Frontier())
	}
}

// TestRedeliveriesKeepToTheAckedAheadWindow: a new leader makes every unsettled
// message below the delivered-to mark ready (Reset), and a mark reserved ahead may run
// far past the acked-ahead window. Those redeliveries must keep to the window as new
// messages do, or their acks fill the set while an offset nearer the frontier is out,
// and every later ack is refused (the chaos tier's drain of events/5 stalled so, seed
// 5901). On the old code all 20 were leased and the 6th ack past the frontier refused.
func TestRedeliveriesKeepToTheAckedAheadWindow(t *testing.T) {
	s := New(Config{Visibility: time.Second, MaxInFlight: 100, MaxAckedAhead: 4}, 1, 0, nil)
	s.SetBounds(0, 100)
	s.Reset(2, 20) // offsets 0 to 19 count as delivered once: all ready
	if !s.Available() {
		t.Fatal("nothing available with 20 messages ready")
	}
	g := mustLease(t, s, 0, 100)
	if len(g) != 5 || g[0].Offset != 0 || g[4].Offset != 4 || g[0].Attempt != 2 {
		t.Fatalf("leased %v; want offsets 0 to 4 (the frontier and 4 acks ahead), attempt 2", g)
	}
	if s.Available() {
		t.Fatal("a redelivery past the window is available")
	}
	for _, x := range g[1:] {
		if err := settle(t, s, x, 1); err != nil {
			t.Fatalf("ack of offset %d, leased under the cap: %v", x.Offset, err)
		}
	}
	if err := settle(t, s, g[0], 1); err != nil || s.Frontier() != 5 {
		t.Fatalf("ack of the frontier: %v, frontier %d; want 5", err, s.Frontier())
	}
	// The window moved with the frontier: the next five are leased, still attempt 2.
	g = mustLease(t, s, 2, 100)
	if len(g) != 5 || g[0].Offset != 5 || g[4].Offset != 9 || g[4].Attempt != 2 {
		t.Fatalf("leased %v after the frontier moved to 5; want offsets 5 to 9, attempt 2", g)
	}
	for _, x := range g {
		if err := settle(t, s, x, 3); err != nil {
			t.Fatalf("ack of offset %d: %v", x.Offset, err)
		}
	}
	if s.Frontier() != 10 {
		t.Fatalf("frontier %d; want 10", s.Frontier())
	}
}

// TestASettleGivenUpThenCommittedIsNotLeasedAgain: a settle whose proposal timed out
// (its outcome unknown) hands the message back for redelivery, and may then commit.
// The message must then leave the redeliveries: before, it was leased again although
// settled (attempt 2), and the ack of that lease, finding the offset settled, never
// ended the lease, which held an in-flight slot until the next leader. Found by an
// adversarial review (5 December); fails on the old code.
func TestASettleGivenUpThenCommittedIsNotLeasedAgain(t *testing.T) {
	s := New(Config{Visibility: time.Second, MaxInFlight: 10, MaxAckedAhead: 10}, 1, 0, nil)
	s.SetBounds(0, 3)
	g := mustLease(t, s, 0, 3)
	if err := s.BeginSettle(g[1].Offset, g[1].Nonce, 1); err != nil {
		t.Fatal(err)
	}
	s.AbortSettle(g[1].Offset)  // the proposal timed out: handed back
	s.CommitSettle(g[1].Offset) // ... and committed after all: the apply settles it
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if again := mustLease(t, s, 2, 10); len(again) != 0 {
		t.Fatalf("leased %v; offset %d is settled and nothing else is free", again, g[1].Offset)
	}
	// The frontier passes it once the others are acked.
	for _, x := range []Grant{g[0], g[2]} {
		if err := settle(t, s, x, 3); err != nil {
			t.Fatal(err)
		}
	}
	if s.Frontier() != 3 {
		t.Fatalf("frontier %d; want 3", s.Frontier())
	}
}

func TestAbortSettleRedelivers(t *testing.T) {
	s := New(cfg, 1, 0, nil)
	s.SetBounds(0, 1)
	g := mustLease(t, s, 0, 1)[0]
	if err := s.BeginSettle(g.Offset, g.Nonce, 1); err != nil {
		t.Fatal(err)
	}
	if s.Expire(int64(time.Hour)) != 0 {
		t.Fatal("a settling lease lapsed")
	}
	if err := s.BeginSettle(g.Offset, g.Nonce, 1); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("racing settle: %v", err)
	}
	s.AbortSettle(g.Offset)
	if again := mustLease(t, s, 2, 1); len(again) != 1 || again[0].Offset != 0 {
		t.Fatalf("not redelivered after a failed settle: %+v", again)
	}
}

func TestRecoveredStateSkipsSettled(t *testing.T) {
	s := New(cfg, 2, 3, []uint64{4, 6})
	s.SetBounds(0, 8)
	var got []uint64
	for _, g := range mustLease(t, s, 0, 10) {
		got = append(got, g.Offset)
		if g.Nonce.Epoch != 2 {
			t.Fatalf("epoch %d", g.Nonce.Epoch)
		}
	}
	want := []uint64{3, 5, 7}
	if len(got) != len(want) {
		t.Fatalf("got %v want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v want %v", got, want)
		}
	}
}

func TestRetentionMovesFrontier(t *testing.T) {
	s := New(cfg, 1, 0, nil)
	s.SetBounds(0, 10)
	g := mustLease(t, s, 0, 3)
	s.SetBounds(5, 10)
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if s.Frontier() != 5 {
		t.Fatalf("frontier %d", s.Frontier())
	}
	if err := s.BeginSettle(g[0].Offset, g[0].Nonce, 1); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("settle of an aged-out offset: %v", err)
	}
	if n := mustLease(t, s, 1, 1); n[0].Offset != 5 {
		t.Fatalf("%+v", n)
	}
}

// TestProperty drives random operations and checks, after each, the invariants and the
// delivery rules: no offset is leased twice at once, the frontier never moves back, a
// settled offset is never delivered again, and a final drain delivers every offset not
// settled. Set QUEUE_SEED to replay a failure.
func TestProperty(t *testing.T) {
	seed := time.Now().UnixNano()
	if v := os.Getenv("QUEUE_SEED"); v != "" {
		seed, _ = strconv.ParseInt(v, 10, 64)
	}
	t.Logf("seed %d (QUEUE_SEED=%d to replay)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	for round := 0; round < 200; round++ {
		c := Config{Visibility: time.Duration(1 + rng.Intn(50)), MaxInFlight: 1 + rng.Intn(8), MaxAckedAhead: 1 + rng.Intn(8)}
		s := New(c, 1, 0, nil)
		settled := map[uint64]bool{}
		live := map[uint64]Grant{}
		var held []Grant
		now, end, frontier := int64(0), uint64(0), uint64(0)
		for step := 0; step < 300; step++ {
			now += int64(rng.Intn(5))
			switch rng.Intn(7) {
			case 0:
				end += uint64(rng.Intn(4))
				s.SetBounds(0, end)
			case 1, 2:
				for _, g := range s.Lease(now, 1+rng.Intn(3)) {
					if settled[g.Offset] {
						t.Fatalf("seed %d: settled offset %d delivered again", seed, g.Offset)
					}
					if prev, ok := live[g.Offset]; ok && prev.Deadline > now {
						t.Fatalf("seed %d: offset %d leased twice at once", seed, g.Offset)
					}
					live[g.Offset] = g
					held = append(held, g)
				}
			case 3, 4:
				if len(held) == 0 {
					continue
				}
				g := held[rng.Intn(len(held))]
				cur, isLive := live[g.Offset]
				err := s.BeginSettle(g.Offset, g.Nonce, now)
				if err == nil && (!isLive || cur.Nonce != g.Nonce || cur.Deadline <= now) {
					t.Fatalf("seed %d: settle of a lapsed or replaced lease succeeded", seed)
				}
				if err == nil {
					if rng.Intn(5) == 0 {
						s.AbortSettle(g.Offset)
						delete(live, g.Offset)
					} else {
						s.CommitSettle(g.Offset)
						settled[g.Offset] = true
						delete(live, g.Offset)
					}
				}
			case 5:
				if len(held) == 0 {
					continue
				}
				g := held[rng.Intn(len(held))]
				d := time.Duration(rng.Intn(3))
				if s.Extend(g.Offset, g.Nonce, now, d) == nil {
					if d == 0 {
						delete(live, g.Offset)
					} else {
						g.Deadline = now + int64(d)
						live[g.Offset] = g
						held = append(held, g)
					}
				}
			case 6:
				if rng.Intn(2) == 0 {
					s.Expire(now)
				} else if len(held) > 0 {
					// A lease granted but never sent goes back without a new nonce being
					// spent on the client: its old one must be dead.
					g := held[rng.Intn(len(held))]
					if cur, ok := live[g.Offset]; ok && cur.Nonce == g.Nonce && cur.Deadline > now {
						s.Unlease(g.Offset, g.Nonce)
						delete(live, g.Offset)
						if s.BeginSettle(g.Offset, g.Nonce, now) == nil {
							t.Fatalf("seed %d: a handed-back lease still settles", seed)
						}
					}
				}
			}
			if f := s.Frontier(); f < frontier {
				t.Fatalf("seed %d: frontier moved back %d -> %d", seed, frontier, f)
			} else {
				frontier = f
			}
			if err := s.CheckInvariants(); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
		}
		// Drain: let every lease lapse, then everything not settled must come out.
		now += int64(time.Hour)
		s.Expire(now)
		s.SetConfig(Config{Visibility: time.Hour, MaxInFlight: 1 << 20, MaxAckedAhead: 1 << 20})
		got := map[uint64]bool{}
		for _, g := range s.Lease(now, 1<<20) {
			got[g.Offset] = true
		}
		for o := uint64(0); o < end; o++ {
			if !settled[o] && !got[o] {
				t.Fatalf("seed %d: unsettled offset %d never redelivered", seed, o)
			}
			if settled[o] && got[o] {
				t.Fatalf("seed %d: settled offset %d redelivered", seed, o)
			}
		}
	}
}

func TestHandleRoundTrip(t *testing.T) {
	h := Handle{Incarnation: 42, Partition: 7, Offset: 1<<63 - 1, Nonce: Nonce{Epoch: 3, Seq: 99}}
	s := h.Encode()
	got, err := DecodeHandle(s)
	if err != nil || got != h {
		t.Fatalf("got %+v %v", got, err)
	}
	b := []byte(s)
	b[10] ^= 1
	if _, err := DecodeHandle(string(b)); !errors.Is(err, ErrBadHandle) {
		t.Fatalf("tampered handle: %v", err)
	}
	for _, bad := range []string{"", "x", s + "A", s[:len(s)-1], "!" + s[1:]} {
		if _, err := DecodeHandle(bad); !errors.Is(err, ErrBadHandle) {
			t.Fatalf("%q: %v", bad, err)
		}
	}
}

// TestHandleWithAChangedFieldIsRefused: a handle whose bytes were changed anywhere, in
// a field or in its checksum, and spelt in valid base64, is refused. Decoded, it
// could name another partition's, or another offset's, lease with the same nonce
// (partitions opened in the same second share an epoch, and their sequence numbers
// run alike), and settling it would end a lease its holder never acked.
// TestHandleRoundTrip's tampering changes the text, which may make it invalid base64
// and so refused without the checksum.
func TestHandleWithAChangedFieldIsRefused(t *testing.T) {
	h := Handle{Incarnation: 42, Partition: 7, Offset: 1000, Nonce: Nonce{Epoch: 3, Seq: 99}}
	raw, err := handleEncoding.DecodeString(h.Encode())
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(raw); i++ { // byte 0, the version, is refused by its own check
		b := append([]byte(nil), raw...)
		b[i] ^= 1
		if got, err := DecodeHandle(handleEncoding.EncodeToString(b)); !errors.Is(err, ErrBadHandle) {
			t.Errorf("a handle with byte %d changed decoded as %+v (%v), want ErrBadHandle", i, got, err)
		}
	}
}

func FuzzDecodeHandle(f *testing.F) {
	f.Add(Handle{Incarnation: 1, Partition: 2, Offset: 3, Nonce: Nonce{4, 5}}.Encode())
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := DecodeHandle(s)
		if err != nil {
			return
		}
		if h.Encode() != s {
			t.Fatalf("decoded %q but it encodes as %q", s, h.Encode())
		}
	})
}

// TestBacklogWithSettledPastEnd: acked-ahead offsets at or past the end (a state
// restored over a log that came back shorter) must not make the backlog underflow.
func TestBacklogWithSettledPastEnd(t *testing.T) {
	s := New(Config{Visibility: time.Second, MaxInFlight: 10, MaxAckedAhead: 10}, 1, 3, []uint64{7, 8})
	s.SetBounds(0, 4)
	if st := s.Stats(); st.Backlog != 1 {
		t.Fatalf("backlog %d over [3, 4) with nothing settled in it, want 1", st.Backlog)
	}
}
