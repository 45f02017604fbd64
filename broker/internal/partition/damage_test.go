package partition

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// journalRecordPos is the position of settle record i in a journal whose records each
// settle one offset below 64 (a 2-byte value: 38-byte frames).
func journalRecordPos(i int) int64 { return int64(i) * 38 }

// TestDamagedSettleRecordKeepsLaterSettles flips a bit in one settle record of the
// journal's active segment after a crash. The settles after it were acknowledged (204):
// they must stay settled. Only the messages of the damaged record come back.
func TestDamagedSettleRecordKeepsLaterSettles(t *testing.T) {
	fs := vfs.NewMem()
	p := mustOpen(t, fs)
	appendN(t, p, 10)
	for _, d := range leaseAll(t, p) {
		if err := settleOne(p, d); err != nil {
			t.Fatal(err)
		}
	}
	fs.Crash()
	p.closeFiles()
	if err := fs.FlipByte("/p/journal/00000000000000000000.log", journalRecordPos(2)+20, 0x08); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, fs)
	if got := fmt.Sprint(offsets(leaseAll(t, p))); got != "[2]" {
		t.Fatalf("delivered %s after a damaged settle record, want [2]: acked messages came back", got)
	}
	if p.journalDamaged != 1 {
		t.Fatalf("%d damaged settle records counted, want 1", p.journalDamaged)
	}
	// Found, reported and counted once: the next start neither reports nor counts it.
	crash(fs, p)
	p = mustOpen(t, fs)
	defer p.Close()
	if got := fmt.Sprint(offsets(leaseAll(t, p))); got != "[2]" || p.journalDamaged != 0 {
		t.Fatalf("second start: delivered %s, %d damaged settle records counted; want [2] and 0", got, p.journalDamaged)
	}
}

// TestDamagedRecordIsSkippedNotWedged (issue 15 #6): a damaged record can never be served
// or settled. It must not pin the frontier (so that every later ack still fits the
// acked-ahead cap), nor hide the records after it; it is skipped, counted, and reported
// through OnDamaged.
func TestDamagedRecordIsSkippedNotWedged(t *testing.T) {
	fs := vfs.NewMem()
	cfg := testQueue
	cfg.MaxAckedAhead = 4
	var reported atomic.Int64
	open := func() *Partition {
		return mustOpen(t, fs, func(o *Options) {
			o.Queue = cfg
			o.SegmentBytes = 200 // five one-digit records per segment: offset 2 lies in a sealed one
			o.OnDamaged = func(log string, n int) {
				if log == "messages" {
					reported.Add(int64(n))
				}
			}
		})
	}
	p := open()
	appendN(t, p, 10)
	p.Close()
	if err := fs.FlipByte("/p/log/00000000000000000000.log", 2*oneDigitFrame+20, 0x08); err != nil {
		t.Fatal(err)
	}
	p = open()
	defer func() { p.Close() }()
	// A consume leases at most MaxAckedAhead past the frontier: lease and ack in rounds.
	var all []Delivery
	for round := 0; round < 10; round++ {
		ds := leaseAll(t, p)
		if len(ds) == 0 {
			break
		}
		all = append(all, ds...)
		for _, d := range ds {
			if err := settleOne(p, d); err != nil {
				t.Fatalf("ack of offset %d: %v", d.Record.Offset, err)
			}
		}
	}
	if got := fmt.Sprint(offsets(all)); got != "[0 1 3 4 5 6 7 8 9]" {
		t.Fatalf("delivered %s, want every record but the damaged one", got)
	}
	if st := p.Stats(); st.Frontier != 10 || st.Backlog != 0 || st.Damaged != 1 || reported.Load() != 1 {
		t.Fatalf("stats %+v, %d reported: want the frontier past the damaged record, one counted", st, reported.Load())
	}
	if more := leaseAll(t, p); len(more) != 0 {
		t.Fatalf("delivered %v after everything was settled", offsets(more))
	}
	// The skip is as durable as an ack: after a crash the frontier does not go back to
	// the damaged record, and it is not skipped (nor counted) again.
	crash(fs, p)
	p = open()
	if st := p.Stats(); st.Frontier != 10 || st.Damaged != 0 {
		t.Fatalf("after a crash: stats %+v; want the frontier still at 10, nothing skipped again", st)
	}
}
