package partition

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// loseLogTail makes a log directory come back as if the disk had lost confirmed writes:
// the segment file keeps only its first keep records' bytes (each frameBytes long), and
// the log's own note of what was durable goes too, so its recovery cannot know.
func loseLogTail(t *testing.T, fs *vfs.Mem, dir string, keep, frameBytes int64) {
	t.Helper()
	if err := fs.TruncateFile(filepath.Join(dir, "00000000000000000000.log"), keep*frameBytes); err != nil {
		t.Fatal(err)
	}
	if err := fs.Remove(filepath.Join(dir, "recovery-point")); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		t.Fatal(err)
	}
	if err := fs.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
}

// wipeLog removes every file of a log directory, durably.
func wipeLog(t *testing.T, fs *vfs.Mem, dir string) {
	t.Helper()
	infos, err := fs.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, fi := range infos {
		if err := fs.Remove(filepath.Join(dir, fi.Name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := fs.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
}

func crash(fs *vfs.Mem, p *Partition) {
	fs.Crash()
	p.closeFiles()
}

// Message frames of appendN's records are 36 bytes plus the value ("0" to "9").
const oneDigitFrame = 37

// TestJournalShorterThanCheckpoint (issue 15 #3): the journal comes back shorter than
// the position the checkpoint covers. Settles written after that must not land at
// positions the checkpoint claims, or the next restart skips them and undoes acks that
// were answered 204.
func TestJournalShorterThanCheckpoint(t *testing.T) {
	fs := vfs.NewMem()
	p := mustOpen(t, fs)
	appendN(t, p, 10)
	ds := leaseAll(t, p)
	for _, d := range ds[:5] {
		if err := settleOne(p, d); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	crash(fs, p)
	wipeLog(t, fs, "/p/journal")

	p = mustOpen(t, fs)
	ds = leaseAll(t, p)
	if got := fmt.Sprint(offsets(ds)); got != "[5 6 7 8 9]" {
		t.Fatalf("after the journal was lost: delivered %s", got)
	}
	for _, d := range ds[:2] { // offsets 5 and 6, answered 204
		if err := settleOne(p, d); err != nil {
			t.Fatal(err)
		}
	}
	crash(fs, p)
	p = mustOpen(t, fs)
	defer p.Close()
	if got := fmt.Sprint(offsets(leaseAll(t, p))); got != "[7 8 9]" {
		t.Fatalf("after a restart: delivered %s, want [7 8 9]: acked messages came back", got)
	}
}

// TestLostLogTailGuardOutlivesRestarts (issue 15 #4): the log loses settled messages,
// new messages take their offsets; the journal's old settles of those offsets must not
// settle the new messages at the second restart either.
func TestLostLogTailGuardOutlivesRestarts(t *testing.T) {
	fs := vfs.NewMem()
	p := mustOpen(t, fs)
	appendN(t, p, 10)
	for _, d := range leaseAll(t, p) {
		if err := settleOne(p, d); err != nil {
			t.Fatal(err)
		}
	}
	crash(fs, p)
	loseLogTail(t, fs, "/p/log", 5, oneDigitFrame)

	for restart := 1; restart <= 3; restart++ {
		p = mustOpen(t, fs)
		if restart == 1 {
			appendN(t, p, 5) // take offsets 5 to 9 again, unacked
		}
		got := fmt.Sprint(offsets(leaseAll(t, p)))
		crash(fs, p)
		if got != "[5 6 7 8 9]" {
			t.Fatalf("restart %d: delivered %s, want the five new messages [5 6 7 8 9]", restart, got)
		}
	}
}

// TestLostLogTailDropsAckedAhead (issue 15 #2): offsets settled out of order at or past
// the end of a log that came back shorter must not count as settled when new messages
// take them.
func TestLostLogTailDropsAckedAhead(t *testing.T) {
	fs := vfs.NewMem()
	p := mustOpen(t, fs)
	appendN(t, p, 10)
	ds := leaseAll(t, p)
	for _, i := range []int{0, 1, 2, 7, 8} {
		if err := settleOne(p, ds[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Checkpoint(); err != nil { // frontier 3, acked ahead {7, 8}
		t.Fatal(err)
	}
	crash(fs, p)
	loseLogTail(t, fs, "/p/log", 4, oneDigitFrame) // offsets 4 to 9 lost

	p = mustOpen(t, fs)
	if st := p.Stats(); st.Backlog != 1 || st.AckedAhead != 0 {
		t.Fatalf("stats over a 4-record log with frontier 3: %+v", st)
	}
	appendN(t, p, 6) // offsets 4 to 9 again
	got := fmt.Sprint(offsets(leaseAll(t, p)))
	crash(fs, p)
	if got != "[3 4 5 6 7 8 9]" {
		t.Fatalf("delivered %s, want [3 4 5 6 7 8 9]: new messages were skipped as settled", got)
	}
	p = mustOpen(t, fs)
	defer p.Close()
	if got := fmt.Sprint(offsets(leaseAll(t, p))); got != "[3 4 5 6 7 8 9]" {
		t.Fatalf("after another restart: delivered %s", got)
	}
}

// TestNewPartitionSurvivesPowerLoss (issue 15 #9): the directories of a new partition
// (topic, partition, log/ and journal/) must be durable before the first append returns;
// otherwise a power loss drops their entries and the acknowledged message with them.
func TestNewPartitionSurvivesPowerLoss(t *testing.T) {
	fs := vfs.NewMem()
	if err := vfs.MkdirAllSync(fs, "/data/topics", 0o700); err != nil { // topics/ exists, durably
		t.Fatal(err)
	}
	dir := "/data/topics/1-t/0"
	p := mustOpen(t, fs, func(o *Options) { o.Dir = dir })
	appendN(t, p, 1)
	ds := leaseAll(t, p)
	if err := settleOne(p, ds[0]); err != nil {
		t.Fatal(err)
	}
	appendN(t, p, 1)
	crash(fs, p)
	p = mustOpen(t, fs, func(o *Options) { o.Dir = dir })
	defer p.Close()
	if got := fmt.Sprint(offsets(leaseAll(t, p))); got != "[1]" {
		t.Fatalf("after a power loss: delivered %s, want [1] (message 0 acked, message 1 stored)", got)
	}
}
