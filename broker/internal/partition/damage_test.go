package partition

import (
	"fmt"
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
	defer p.Close()
	if got := fmt.Sprint(offsets(leaseAll(t, p))); got != "[2]" {
		t.Fatalf("delivered %s after a damaged settle record, want [2]: acked messages came back", got)
	}
	if p.journalDamaged != 1 {
		t.Fatalf("%d damaged settle records counted, want 1", p.journalDamaged)
	}
}
