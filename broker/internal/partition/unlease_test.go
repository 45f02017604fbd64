package partition

import (
	"io/fs"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// readHookFS runs *hook, once set, at the next read of any file: a test makes a read
// slow there, or lets another request in.
type readHookFS struct {
	vfs.FS
	hook *atomic.Pointer[func()]
}

func (f readHookFS) OpenFile(name string, flag int, perm fs.FileMode) (vfs.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return readHookFile{file, f.hook}, nil
}

type readHookFile struct {
	vfs.File
	hook *atomic.Pointer[func()]
}

func (f readHookFile) ReadAt(b []byte, off int64) (int, error) {
	if h := f.hook.Swap(nil); h != nil {
		(*h)()
	}
	return f.File.ReadAt(b, off)
}

// TestAMessageLeftOutOfAFullAnswerKeepsAnotherConsumersLease: a consume hands back,
// uncounted, the messages it leased that its answer has no room for. Its read of the
// first ones can outlast their leases (a slow disk, a visibility timeout of 100 ms),
// and another consume may lease a lapsed message meanwhile and hand it out. The hand
// back went by offset alone: it ended the other consumer's live lease, the message was
// delivered again at once to a third, with the same delivery_attempt, and the holder's
// ack answered 410 within its lease. Only the lease the consume took is handed back.
func TestAMessageLeftOutOfAFullAnswerKeepsAnotherConsumersLease(t *testing.T) {
	var now atomic.Int64
	now.Store(int64(time.Hour))
	hook := &atomic.Pointer[func()]{}
	p := mustOpen(t, readHookFS{vfs.NewMem(), hook}, func(o *Options) { o.Clock = now.Load })
	defer p.Close()
	for range 2 {
		if _, err := p.Append([]segment.Record{{Value: make([]byte, 1000)}}); err != nil {
			t.Fatal(err)
		}
	}
	var other []Delivery
	slowRead := func() {
		// The first consume's leases lapse while it reads; another consume leases
		// both messages again.
		now.Add(int64(2 * time.Second))
		var err error
		if other, err = p.Lease(2, time.Minute, 1<<20); err != nil || len(other) != 2 {
			t.Errorf("the other consume leased %d: %v", len(other), err)
		}
	}
	hook.Store(&slowRead)
	// Room for one message of the two: the second is handed back.
	first, err := p.Lease(2, time.Second, 1000)
	if err != nil || len(first) != 1 {
		t.Fatalf("the first consume leased %d: %v", len(first), err)
	}
	if len(other) != 2 || other[1].Record.Offset != 1 {
		t.Fatalf("the other consume got %+v", other)
	}
	if again := leaseAll(t, p); len(again) != 0 {
		t.Fatalf("offset %d, leased for a minute by the other consume, was leased again at once (attempt %d)", again[0].Record.Offset, again[0].Attempt)
	}
	if err := settleOne(p, other[1]); err != nil {
		t.Fatalf("the other consume's ack of offset 1 within its lease: %v", err)
	}
}

// TestMessagesLeasedPastWhatRetentionRemovedAreServed: a consume leased a run of
// messages, and before it read them retention removed the first ones. The leases of
// the removed messages ended, and the consume went on to the next run; the messages
// of the run that retention left were neither served nor handed back: nobody could
// have them until their lease lapsed (a visibility timeout, up to 12 h), and then
// they came as delivery_attempt 2 at their first delivery. They are handed back,
// uncounted, for the next consume.
func TestMessagesLeasedPastWhatRetentionRemovedAreServed(t *testing.T) {
	var wall atomic.Int64
	wall.Store(1_000_000)
	hook := &atomic.Pointer[func()]{}
	p := mustOpen(t, readHookFS{vfs.NewMem(), hook}, func(o *Options) { o.WallClock = wall.Load })
	defer p.Close()
	// Segments [0 1] [2 3] [4 5] [6 7]; the first two age out.
	for i := range 8 {
		if i == 4 {
			wall.Store(2_000_000)
		}
		appendN(t, p, 1)
		if i%2 == 1 && i < 7 {
			if err := p.log.Roll(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Offset 0 waits for redelivery and 1 is settled, so the next lease takes two
	// runs: [0] and [2 .. 7].
	ds, err := p.Lease(2, time.Hour, 1<<20)
	if err != nil || len(ds) != 2 {
		t.Fatalf("leased %d: %v", len(ds), err)
	}
	if err := settleOne(p, ds[1]); err != nil {
		t.Fatal(err)
	}
	if err := p.Extend(ds[0].Record.Offset, ds[0].Nonce, 0); err != nil {
		t.Fatal(err)
	}
	retain := func() {
		if _, err := p.EnforceRetention(1_500_000); err != nil {
			t.Error(err)
		}
	}
	hook.Store(&retain) // runs while offset 0 is read, before the run [2 .. 7]
	first, err := p.Lease(10, time.Hour, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if o := p.log.Oldest(); o != 4 {
		t.Fatalf("retention left the log from offset %d, want 4", o)
	}
	served := map[uint64]bool{}
	for _, d := range first {
		served[d.Record.Offset] = true
	}
	for _, d := range leaseAll(t, p) {
		if served[d.Record.Offset] {
			t.Fatalf("offset %d served twice", d.Record.Offset)
		}
		if d.Attempt != 1 {
			t.Errorf("offset %d came as delivery_attempt %d at its first delivery", d.Record.Offset, d.Attempt)
		}
		served[d.Record.Offset] = true
	}
	for o := uint64(4); o < 8; o++ {
		if !served[o] {
			t.Errorf("offset %d, left by retention, was served by neither consume: it is leased to nobody for an hour", o)
		}
	}
}
