package wal

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// armingSyncer syncs the data files of a checkpoint, then, when armed, fails the next
// File.Sync: the one that makes the checkpointed file's free header durable.
type armingSyncer struct {
	m   *vfs.Mem
	arm atomic.Bool
}

func (s *armingSyncer) SyncFiles(files []vfs.File) error {
	if err := (vfs.EachFile{}).SyncFiles(files); err != nil {
		return err
	}
	if s.arm.Swap(false) {
		s.m.FailSync(1)
	}
	return nil
}

// TestAFreeHeaderIsMadeDurableAtOpen: a checkpoint wrote a file's header free and its
// sync failed (the node then exits with 74; a kill -9 between the write and the sync
// leaves the same). The next start read the header free from the page cache, replayed
// nothing, and left the disk saying "in use" with the old records. That life cut a
// data file and wrote new bytes over it; after a power loss the old header was back
// and the replay wrote the old records over the new data. Open now writes every free
// header again and syncs it. (Found in review; fails on the code before.)
func TestAFreeHeaderIsMadeDurableAtOpen(t *testing.T) {
	m := vfs.NewMem()
	s := &armingSyncer{m: m}
	opts := Options{FS: m, Root: root, FileBytes: 64 << 10, Syncer: s, OnFail: func(error) {}}
	w, _, err := Open(walDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	x := dataFile(t, m, "x.log")
	write(t, w, x, "x.log", 0, []byte("xxxx"))
	if err := w.Checkpoint(); err != nil { // file 0 freed, file 1 current
		t.Fatal(err)
	}
	d := dataFile(t, m, "d.log")
	old := []byte("OLD-OLD-OLD-OLD!")
	write(t, w, d, "d.log", 0, old) // into file 1
	s.arm.Store(true)
	if err := w.Checkpoint(); !errors.Is(err, ErrFailed) { // file 1's free header not synced
		t.Fatalf("Checkpoint: %v, want the armed sync failure", err)
	}
	_ = w.Close() // the process exits (74); nothing more is written

	// Next start: no power loss yet, so the page cache still reads file 1 as free.
	w2, rep, err := Open(walDir, Options{FS: m, Root: root, FileBytes: 64 << 10, OnFail: func(error) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second start replayed %+v", rep)
	d2, err := m.OpenFile(filepath.Join(root, "d.log"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A cut, as raftstore makes one: truncate and sync (it checkpoints first).
	if err := w2.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if err := d2.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if err := d2.Sync(); err != nil {
		t.Fatal(err)
	}
	newer := []byte("NEW!")
	write(t, w2, d2, "d.log", 0, newer)

	m.Crash() // power loss
	_, rep, err = Open(walDir, Options{FS: m, Root: root, FileBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the power loss, replayed %+v", rep)
	if got := content(t, m, "d.log"); !bytes.Equal(got, newer) {
		t.Fatalf("d.log after the power loss = %q, want %q (an old use's records were replayed over it)", got, newer)
	}
}
