package partition

import (
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestDiscardDataSetsTheLogAndJournalAside: a replica's data set aside as damaged
// (DiscardData) opens again empty, its message log and settle journal in damaged/,
// on the in-memory file system the crash and model tests run on as on a disk, and
// after a power cut too. vfs.Mem renamed files only: the log/ and journal/
// directories stayed where they were without an error (a missing name is no error to
// the discard), so TestModelReplicas's "data set aside" step set aside the queue
// checkpoint and the epoch and kept every message and settle record in place, and the
// rebuild of a replica from its group's log or snapshot was never tested from empty.
func TestDiscardDataSetsTheLogAndJournalAside(t *testing.T) {
	fs := vfs.NewMem()
	p := mustOpen(t, fs)
	appendN(t, p, 5)
	for _, d := range leaseAll(t, p)[:2] {
		if err := settleOne(p, d); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := DiscardData(fs, "/p"); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for _, name := range []string{"/p/log", "/p/journal", "/p/queue.ckpt", "/p/epoch"} {
			if _, err := fs.Stat(name); err == nil {
				t.Errorf("%s: %s is still in place", when, name)
			}
		}
		for _, name := range []string{"/p/damaged/log/00000000000000000000.log", "/p/damaged/journal/00000000000000000000.log", "/p/damaged/queue.ckpt"} {
			if _, err := fs.Stat(name); err != nil {
				t.Errorf("%s: %s was not set aside: %v", when, name, err)
			}
		}
	}
	check("after the discard")
	fs.Crash() // the discard synced the directory: what it did stays
	check("after a power cut")
	p = mustOpen(t, fs)
	defer p.Close()
	if st := p.Stats(); st.End != 0 || st.Frontier != 0 {
		t.Errorf("the replica opened after the discard holds messages up to %d (frontier %d); want an empty one", st.End, st.Frontier)
	}
}
