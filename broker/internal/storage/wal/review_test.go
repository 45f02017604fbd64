package wal

import (
	"bytes"
	"errors"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// zeroRange damages name on "disk": bytes [off, off+n) read as zeros, as a sector
// the disk lost or returns zeroed would.
func zeroRange(t *testing.T, m *vfs.Mem, name string, off, n int64) {
	t.Helper()
	b, err := m.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	for i := off; i < off+n; i++ {
		if b[i] != 0 {
			if err := m.FlipByte(name, i, b[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestADamagedRecordHeaderSkipsNoValidRecord: a record whose whole 16-byte header is
// damaged (its length and its sequence both: a sector lost or read back as zeros)
// ended the replay of its write-ahead file without a word, dropping every record
// after it, of every partition and Raft log of the node. The records after it are
// the only copy of acknowledged writes once a power loss took their data files'
// unsynced pages. No record of the use can be forged, so the first valid record of
// the use after the damaged one is where the replay goes on, as it does when only
// the length is damaged.
func TestADamagedRecordHeaderSkipsNoValidRecord(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 0)
	names := []string{"t/a.log", "t/b.log", "t/c.log", "t/d.log"}
	data := bytes.Repeat([]byte{'x'}, 64-recHeaderLen-2-len("t/a.log")-8) // records of 64 bytes
	for _, n := range names {
		write(t, w, dataFile(t, m, n), n, 0, data)
	}
	zeroRange(t, m, filepath.Join(walDir, "00000000.wal"), headerLen, recHeaderLen)
	m.Crash()
	_, rep := open(t, m, 0)
	for _, n := range names[1:] {
		if got := content(t, m, n); !bytes.Equal(got, data) {
			t.Errorf("%s = %q after replay (%+v): an acknowledged record after the damaged one was dropped", n, got, rep)
		}
	}
	if rep.Damaged != 1 || rep.Records != 3 {
		t.Fatalf("replayed %+v, want 3 records and 1 damaged", rep)
	}
}

// blockingSyncer holds every checkpoint in its sync until release is closed: the
// write-ahead files handed to the checkpointer stay in use, as when a power cut
// comes while a checkpoint runs.
type blockingSyncer struct{ release chan struct{} }

func (s blockingSyncer) SyncFiles(fs []vfs.File) error {
	<-s.release
	return vfs.EachFile{}.SyncFiles(fs)
}

// TestADamagedLastRecordOfAFullFileIsCounted: a write-ahead file that was full and
// handed to its checkpoint holds only records of rounds that were synced and
// answered; the end of its use is never a torn round (the writer rotates only after
// a round succeeded, and stops at the first that fails). So a record there that
// fails its checks while its sequence field reads the use's, with no valid record
// after it, is a damaged acknowledged write, not the end of the use. The replay took
// it for the end and said nothing: its data file, if a power loss left it without
// those bytes at its tail, cuts them as a torn write, and an answered message is gone
// without a count or a log line.
func TestADamagedLastRecordOfAFullFileIsCounted(t *testing.T) {
	m := vfs.NewMem()
	release := make(chan struct{})
	w, _, err := Open(walDir, Options{FS: m, Root: root, FileBytes: 1 << 10, Syncer: blockingSyncer{release}})
	if err != nil {
		t.Fatal(err)
	}
	a, b := dataFile(t, m, "t/a.log"), dataFile(t, m, "t/b.log")
	data := bytes.Repeat([]byte{'a'}, 100)
	rec := int64(recHeaderLen + 2 + len("t/a.log") + 8 + len(data))
	n := (1<<10 - headerLen) / rec // records that fit in the first file
	for i := range n {
		write(t, w, a, "t/a.log", i*100, data)
	}
	write(t, w, b, "t/b.log", 0, data) // does not fit: file 0 waits for its checkpoint
	// The last record of file 0, a.log's last write: a bit of its data rots.
	last := headerLen + (n-1)*rec
	if err := m.FlipByte(filepath.Join(walDir, "00000000.wal"), last+rec-1, 0x01); err != nil {
		t.Fatal(err)
	}
	m.Crash()
	close(release)
	_, rep := open(t, m, 1<<10)
	if rep.Damaged != 1 || rep.FirstDamaged == "" {
		t.Fatalf("replayed %+v: the damaged last record of a full file was taken for the end of its use, not counted", rep)
	}
	if rep.Records != int(n) { // n-1 of file 0, 1 of file 1
		t.Fatalf("replayed %+v, want %d records", rep, n)
	}
}

// TestCloseWhileTheRotationWaitsForACheckpointThatCannotOpen: a checkpoint that
// cannot open a data file (out of descriptors) retries until the WAL closes. But
// Close marked the WAL closing for the checkpointer only after the writer was done,
// and a writer whose rotation waited for that very checkpoint (maxFull files full)
// was never done: Close hung for as long as the open kept failing, with it the
// commits queued behind the rotation. The checkpoint now gives up when the WAL is
// closing and the rotation waits for it: the WAL fails closed, Close and the
// commits return (the next start replays the records).
func TestCloseWhileTheRotationWaitsForACheckpointThatCannotOpen(t *testing.T) {
	defer func(d time.Duration) { retryWait = d }(retryWait)
	retryWait = 5 * time.Millisecond
	m := &openFailing{Mem: vfs.NewMem()}
	w, _, err := Open(walDir, Options{FS: m, Root: root, FileBytes: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	f := dataFile(t, m.Mem, "a.log")
	m.mu.Lock()
	m.n = 1 << 30 // every open of a data file fails from now on: no checkpoint finishes
	m.mu.Unlock()
	// One record a file: the 2nd, 3rd and 4th commits each rotate (maxFull files then
	// wait for their checkpoint), and the 5th one's rotation waits for a checkpoint.
	data := bytes.Repeat([]byte{'a'}, 600)
	var done atomic.Int32
	committed := make(chan error, 1)
	go func() {
		for i := range maxFull + 2 {
			_, _ = f.WriteAt(data, int64(i*600))
			err := w.Commit([]Span{{Path: filepath.Join(root, "a.log"), Off: int64(i * 600), Data: data}})
			if err != nil || i == maxFull+1 {
				committed <- err
				return
			}
			done.Add(1)
		}
	}()
	// Wait until the last commit is queued or in its round (after the 4th returned,
	// nothing else queues or begins a round).
	for {
		w.mu.Lock()
		queued := len(w.pending) > 0
		w.mu.Unlock()
		if done.Load() == maxFull+1 && (queued || w.roundSince.Load() != 0) {
			break
		}
		select {
		case err := <-committed:
			t.Fatalf("a commit returned early: %v", err)
		default:
		}
		runtime.Gosched()
	}
	closed := make(chan error, 1)
	go func() { closed <- w.Close() }()
	select {
	case err := <-closed:
		if err == nil {
			t.Fatal("Close answered nil while files it could not checkpoint stay in use")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close hangs while the rotation waits for a checkpoint that cannot open its data file")
	}
	select {
	case err := <-committed:
		if !errors.Is(err, ErrFailed) {
			t.Fatalf("the commit behind the rotation: %v, want ErrFailed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the commit behind the rotation hangs")
	}
}
