package wal

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

const root = "/data"

var walDir = filepath.Join(root, "wal")

func open(t *testing.T, m *vfs.Mem, fileBytes int64) (*WAL, Replayed) {
	t.Helper()
	if fileBytes == 0 {
		fileBytes = 64 << 10
	}
	w, rep, err := Open(walDir, Options{FS: m, Root: root, FileBytes: fileBytes})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return w, rep
}

// dataFile creates name under root, durably (the file and its directory entry), as
// the segment log does before it writes into a new segment.
func dataFile(t *testing.T, m *vfs.Mem, name string) vfs.File {
	t.Helper()
	p := filepath.Join(root, name)
	if err := vfs.MkdirAllSync(m, filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := m.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir(filepath.Dir(p)); err != nil {
		t.Fatal(err)
	}
	return f
}

// write writes data into f at off, unsynced, and commits it.
func write(t *testing.T, w *WAL, f vfs.File, name string, off int64, data []byte) {
	t.Helper()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit([]Span{{Path: filepath.Join(root, name), Off: off, Data: data}}); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func content(t *testing.T, m *vfs.Mem, name string) []byte {
	t.Helper()
	b, err := m.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCommittedWritesSurviveACrash: the data files are never synced by the writer;
// what a commit returned for is back after a power loss and Open's replay. Without
// the replay the data is gone, which the test checks first, so it fails if Commit
// did not record it.
func TestCommittedWritesSurviveACrash(t *testing.T) {
	m := vfs.NewMem()
	helloWorld(t, m)
	m.Crash()
	if got := content(t, m, "t/a.log"); len(got) != 0 {
		t.Fatalf("the data file was synced by someone: %q", got)
	}
	_, rep := open(t, m, 0)
	if rep.Records != 3 || rep.Files != 1 {
		t.Fatalf("replayed %+v, want 3 records of 1 file", rep)
	}
	if got := content(t, m, "t/a.log"); string(got) != "hello world" {
		t.Fatalf("a.log = %q after replay", got)
	}
	if got := content(t, m, "t/b.log"); string(got) != "other" {
		t.Fatalf("b.log = %q after replay", got)
	}
	// The replay made them durable and freed the file: another crash keeps them
	// and a second Open replays nothing.
	m.Crash()
	_, rep = open(t, m, 0)
	if rep.Records != 0 || string(content(t, m, "t/a.log")) != "hello world" {
		t.Fatalf("after a second crash: replayed %+v, a.log = %q", rep, content(t, m, "t/a.log"))
	}
}

// helloWorld opens the WAL and commits "hello " and "world" to t/a.log and "other" to
// t/b.log, all three in the first write-ahead file, their data files unsynced.
func helloWorld(t *testing.T, m *vfs.Mem) *WAL {
	t.Helper()
	w, _ := open(t, m, 0)
	a, b := dataFile(t, m, "t/a.log"), dataFile(t, m, "t/b.log")
	write(t, w, a, "t/a.log", 0, []byte("hello "))
	write(t, w, b, "t/b.log", 0, []byte("other"))
	write(t, w, a, "t/a.log", 6, []byte("world"))
	return w
}

// TestConcurrentCommitsAcrossRotations: many writers, files small enough to rotate
// and checkpoint often, a torn crash at the end: every committed write is there.
func TestConcurrentCommitsAcrossRotations(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 4<<10)
	const writers, each, size = 8, 200, 37
	var wg sync.WaitGroup
	for i := range writers {
		f := dataFile(t, m, fmt.Sprintf("p%d/seg.log", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range each {
				data := bytes.Repeat([]byte{byte('a' + (i+j)%26)}, size)
				if _, err := f.WriteAt(data, int64(j*size)); err != nil {
					t.Error(err)
					return
				}
				if err := w.Commit([]Span{{Path: filepath.Join(root, fmt.Sprintf("p%d/seg.log", i)), Off: int64(j * size), Data: data}}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if s := w.Stats(); s.Records != writers*each || s.Checkpoints == 0 {
		t.Fatalf("stats %+v: want %d records and some checkpoints", s, writers*each)
	}
	m.CrashTorn(rand.New(rand.NewSource(1)))
	open(t, m, 4<<10)
	for i := range writers {
		got := content(t, m, fmt.Sprintf("p%d/seg.log", i))
		if len(got) < each*size {
			t.Fatalf("p%d holds %d bytes, want %d", i, len(got), each*size)
		}
		for j := range each {
			if want := bytes.Repeat([]byte{byte('a' + (i+j)%26)}, size); !bytes.Equal(got[j*size:(j+1)*size], want) {
				t.Fatalf("p%d write %d = %q", i, j, got[j*size:(j+1)*size])
			}
		}
	}
}

// TestAnEarlierUseIsNeverReplayed: a file reused after a restart carries records of
// its earlier use behind the new ones. Open must start the new use under a sequence
// the old records do not have, or the old record after the new one would be redone
// over newer data: the freed header keeps the last sequence, and wal/seq keeps a
// floor for when a power cut tore that header as it was rewritten (torn).
func TestAnEarlierUseIsNeverReplayed(t *testing.T) {
	for _, torn := range []bool{false, true} {
		m := vfs.NewMem()
		earlierUse(t, m)
		if torn {
			if err := m.FlipByte(filepath.Join(walDir, "00000000.wal"), 13, 0xff); err != nil {
				t.Fatal(err)
			}
		}
		m.Crash()
		if got := nextUse(t, m); got != "new-0" {
			t.Fatalf("torn header %v: q.log = %q: a record of an earlier use was replayed", torn, got)
		}
		if got := content(t, m, "r.log"); string(got) != "rrrrr" {
			t.Fatalf("torn header %v: r.log = %q", torn, got)
		}
	}
}

// earlierUse commits two records to q.log through the first write-ahead file, cuts the
// power, and runs a life that replays them, frees every file and stops before its
// first commit: no file is in use after it, the first holds the old records.
func earlierUse(t *testing.T, m *vfs.Mem) {
	t.Helper()
	w, _ := open(t, m, 0)
	q := dataFile(t, m, "q.log")
	dataFile(t, m, "r.log")
	write(t, w, q, "q.log", 0, []byte("old-1"))
	write(t, w, q, "q.log", 0, []byte("old-2"))
	m.Crash()
	open(t, m, 0)
}

// nextUse runs the life after earlierUse's: it reuses the first file, overwrites
// q.log durably by itself, then commits one record of the same length as the old
// ones, to r.log; then the power fails and a start replays. It returns what q.log
// holds then ("new-0" unless an old record was replayed over it).
func nextUse(t *testing.T, m *vfs.Mem) string {
	t.Helper()
	w, _ := open(t, m, 0)
	q, _ := m.OpenFile(filepath.Join(root, "q.log"), os.O_RDWR, 0)
	if _, err := q.WriteAt([]byte("new-0"), 0); err != nil {
		t.Fatal(err)
	}
	if err := q.Sync(); err != nil {
		t.Fatal(err)
	}
	r, _ := m.OpenFile(filepath.Join(root, "r.log"), os.O_RDWR, 0)
	write(t, w, r, "r.log", 0, []byte("rrrrr"))
	m.Crash()
	open(t, m, 0)
	return string(content(t, m, "q.log"))
}

// TestCheckpointBeforeRemoval: after Checkpoint no record of a removed file is
// replayed into a new file at the same path; without it, one is (so the test
// shows what Checkpoint is for).
func TestCheckpointBeforeRemoval(t *testing.T) {
	for _, checkpoint := range []bool{true, false} {
		m := vfs.NewMem()
		w, _ := open(t, m, 0)
		f := dataFile(t, m, "dir/seg.log")
		write(t, w, f, "dir/seg.log", 0, []byte("incarnation one"))
		if checkpoint {
			if err := w.Checkpoint(); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Remove(filepath.Join(root, "dir/seg.log")); err != nil {
			t.Fatal(err)
		}
		if err := m.SyncDir(filepath.Join(root, "dir")); err != nil {
			t.Fatal(err)
		}
		if err := m.WriteFile(filepath.Join(root, "dir/seg.log"), []byte("two")); err != nil {
			t.Fatal(err)
		}
		m.Crash()
		open(t, m, 0)
		got := string(content(t, m, "dir/seg.log"))
		if checkpoint && got != "two" {
			t.Fatalf("with a checkpoint: the new file holds %q", got)
		}
		if !checkpoint && got == "two" {
			t.Fatalf("without a checkpoint the old record was not replayed: the test no longer shows the hazard")
		}
	}
}

// TestRemovedFileIsSkipped: a record whose file was removed (a deleted topic) is
// counted and skipped; Open does not fail.
func TestRemovedFileIsSkipped(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 0)
	f := dataFile(t, m, "gone/seg.log")
	write(t, w, f, "gone/seg.log", 0, []byte("x"))
	if err := m.Remove(filepath.Join(root, "gone/seg.log")); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir(filepath.Join(root, "gone")); err != nil {
		t.Fatal(err)
	}
	m.Crash()
	_, rep := open(t, m, 0)
	if rep.Skipped != 1 || rep.Records != 0 {
		t.Fatalf("replayed %+v, want 1 skipped", rep)
	}
}

// TestFailedSyncFailsClosed: a failed fdatasync of the write-ahead file fails that
// commit with an error that does not say "not written" (the record may be durable)
// and every later one; OnFail hears of it once.
func TestFailedSyncFailsClosed(t *testing.T) {
	m := vfs.NewMem()
	var heard []error
	w, _, err := Open(walDir, Options{FS: m, Root: root, FileBytes: 64 << 10, OnFail: func(err error) { heard = append(heard, err) }})
	if err != nil {
		t.Fatal(err)
	}
	f := dataFile(t, m, "a.log")
	m.FailSync(1)
	_, _ = f.WriteAt([]byte("x"), 0)
	err = w.Commit([]Span{{Path: filepath.Join(root, "a.log"), Off: 0, Data: []byte("x")}})
	if !errors.Is(err, ErrFailed) || errors.Is(err, ErrNotWritten) {
		t.Fatalf("commit over a failed sync: %v", err)
	}
	err = w.Commit([]Span{{Path: filepath.Join(root, "a.log"), Off: 1, Data: []byte("y")}})
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("commit after the failure: %v", err)
	}
	w.Fail(errors.New("a data file's sync too"))
	if len(heard) != 1 || !errors.Is(heard[0], ErrFailed) {
		t.Fatalf("OnFail heard %v, want the one failure", heard)
	}
}

// TestFailedCheckpointFailsCheckpoint: a Checkpoint whose file's checkpoint fails
// (the sync of a data file) reports the failure; it never returns nil while the file
// holding the records stays in use, which a start would replay into files the caller
// has since cut. Run many times: the failure and the waiter's wake-up race.
func TestFailedCheckpointFailsCheckpoint(t *testing.T) {
	for i := range 200 {
		m := vfs.NewMem()
		w, _ := open(t, m, 0)
		f := dataFile(t, m, "a.log")
		write(t, w, f, "a.log", 0, []byte("old"))
		m.FailSync(2) // the new file's header (the rotation's round), then a.log
		err := w.Checkpoint()
		if err == nil {
			m.Crash()
			if _, rep := open(t, m, 0); rep.Records > 0 {
				t.Fatalf("run %d: Checkpoint returned nil, and a start replays %d records", i, rep.Records)
			}
			continue
		}
		if !errors.Is(err, ErrFailed) {
			t.Fatalf("run %d: Checkpoint over a failed sync: %v", i, err)
		}
		_ = w.Close()
	}
}

// TestPathOutsideRoot is refused and writes nothing.
func TestPathOutsideRoot(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 0)
	err := w.Commit([]Span{{Path: "/elsewhere/x", Off: 0, Data: []byte("x")}})
	if !errors.Is(err, ErrNotWritten) {
		t.Fatalf("commit outside the root: %v", err)
	}
	if s := w.Stats(); s.Records != 0 {
		t.Fatalf("stats %+v", s)
	}
	// Refused alone: commits made at the same time are written.
	f := dataFile(t, m, "a.log")
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			_ = w.Commit([]Span{{Path: "/elsewhere/x", Off: 0, Data: []byte("x")}})
		}()
		go func() {
			defer wg.Done()
			if _, err := f.WriteAt([]byte{byte(i)}, int64(i)); err != nil {
				t.Error(err)
			}
			if err := w.Commit([]Span{{Path: filepath.Join(root, "a.log"), Off: int64(i), Data: []byte{byte(i)}}}); err != nil {
				t.Errorf("a commit beside one outside the root: %v", err)
			}
		}()
	}
	wg.Wait()
}

// TestCloseLeavesNothingToReplay: a clean stop makes the data files durable and frees
// the write-ahead file; a power loss after it loses nothing and replays nothing, and
// Close made no new write-ahead file to do it.
func TestCloseLeavesNothingToReplay(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 0)
	f := dataFile(t, m, "a.log")
	write(t, w, f, "a.log", 0, []byte("kept"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit([]Span{{Path: filepath.Join(root, "a.log"), Data: []byte("x")}}); !errors.Is(err, ErrNotWritten) {
		t.Fatalf("commit after Close: %v", err)
	}
	m.Crash()
	if got := content(t, m, "a.log"); string(got) != "kept" {
		t.Fatalf("a.log = %q after Close and a crash", got)
	}
	_, rep := open(t, m, 0)
	if rep.Records != 0 || rep.Files != 0 {
		t.Fatalf("replayed %+v after a clean Close", rep)
	}
	n := 0
	ents, _ := m.ReadDir(walDir)
	for _, e := range ents {
		if filepath.Ext(e.Name) == fileExt {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d write-ahead files after one clean life, want 1", n)
	}
}

// TestShortFileIsFilled: a write-ahead file cut short (a crash while it was being
// made) is filled to its size at Open, so that no round ever has to grow it.
func TestShortFileIsFilled(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 0)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(walDir, "00000000.wal")
	if err := m.TruncateFile(name, 100); err != nil {
		t.Fatal(err)
	}
	w, _ = open(t, m, 0)
	defer w.Close()
	if b, err := m.ReadFile(name); err != nil || len(b) != 64<<10 {
		t.Fatalf("%s holds %d bytes after Open (%v), want %d", name, len(b), err, 64<<10)
	}
}

// TestOversizedRoundOnAFullDisk: a round larger than a write-ahead file reserves its
// space before it writes: on a full disk it fails with ErrNotWritten (its spans are
// undone by their logs) and the WAL stays usable once space is back.
func TestOversizedRoundOnAFullDisk(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 64<<10)
	f := dataFile(t, m, "a.log")
	big := bytes.Repeat([]byte("x"), 100<<10)
	if _, err := f.WriteAt(big, 0); err != nil {
		t.Fatal(err)
	}
	m.SetFreeSpace(1 << 10)
	err := w.Commit([]Span{{Path: filepath.Join(root, "a.log"), Off: 0, Data: big}})
	if !errors.Is(err, ErrNotWritten) {
		t.Fatalf("a 100 KiB round on a full disk: %v, want ErrNotWritten", err)
	}
	m.SetFreeSpace(-1)
	write(t, w, f, "a.log", 0, []byte("y"))
	write(t, w, f, "a.log", 0, big) // and the big one, with room
}

type slowSyncer struct{ d time.Duration }

func (s slowSyncer) SyncFiles(fs []vfs.File) error {
	time.Sleep(s.d)
	return vfs.EachFile{}.SyncFiles(fs)
}

// TestCheckpointUnderLoad: with writers filling files faster than checkpoints free
// them, Checkpoint still returns (it waits for the files full when it was called, not
// for a queue that never empties), and the commits wait for the checkpoints instead
// of piling up write-ahead files.
func TestCheckpointUnderLoad(t *testing.T) {
	m := vfs.NewMem()
	w, _, err := Open(walDir, Options{FS: m, Root: root, FileBytes: 4 << 10, Syncer: slowSyncer{20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range 4 {
		name := fmt.Sprintf("p%d.log", i)
		f := dataFile(t, m, name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := bytes.Repeat([]byte{'a'}, 512)
			for j := 0; !stop.Load(); j++ {
				off := int64(j%64) * 512
				if _, err := f.WriteAt(data, off); err != nil {
					t.Error(err)
					return
				}
				if err := w.Commit([]Span{{Path: filepath.Join(root, name), Off: off, Data: data}}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait(); _ = w.Close() }()
	time.Sleep(100 * time.Millisecond)
	for range 3 {
		done := make(chan error, 1)
		go func() { done <- w.Checkpoint() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Checkpoint did not return in 10 s under load")
		}
	}
	n := 0
	ents, _ := m.ReadDir(walDir)
	for _, e := range ents {
		if filepath.Ext(e.Name) == fileExt {
			n++
		}
	}
	if limit := 1 + defaultSpares + maxFull + 1; n > limit {
		t.Fatalf("%d write-ahead files under load, want at most %d", n, limit)
	}
}

// TestCloseRacesCommitsAndCheckpoints: Close while commits and checkpoints run, some
// with a failing sync, never hangs; a Checkpoint after Close fails rather than
// pretending the data is durable in its files.
func TestCloseRacesCommitsAndCheckpoints(t *testing.T) {
	for it := range 60 {
		m := vfs.NewMem()
		w, _, err := Open(walDir, Options{FS: m, Root: root, FileBytes: 2 << 10, Spares: 1})
		if err != nil {
			t.Fatal(err)
		}
		f := dataFile(t, m, "a.log")
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 50 {
					if g%3 == 0 && j%7 == 0 {
						_ = w.Checkpoint()
						continue
					}
					d := bytes.Repeat([]byte{'z'}, 100)
					_, _ = f.WriteAt(d, int64(j*100))
					if w.Commit([]Span{{Path: filepath.Join(root, "a.log"), Off: int64(j * 100), Data: d}}) != nil {
						return
					}
				}
			}()
		}
		if it%3 == 1 {
			m.FailSync(5 + it%11)
		}
		time.Sleep(time.Duration(it%5) * time.Millisecond)
		closed := make(chan struct{})
		go func() { _ = w.Close(); wg.Wait(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("iteration %d: Close hangs", it)
		}
		if err := w.Checkpoint(); err == nil {
			t.Fatalf("iteration %d: Checkpoint after Close answered nil", it)
		}
		m.FailSync(0)
	}
}

// TestReplayAlone: Replay redoes what a crash left, like Open, and leaves the files
// free; it creates no file (a fold on a full disk), and a missing directory replays
// nothing.
func TestReplayAlone(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 0)
	a := dataFile(t, m, "t/a.log")
	write(t, w, a, "t/a.log", 0, []byte("hello"))
	m.Crash()
	before, err := m.ReadDir(walDir)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Replay(walDir, Options{FS: m, Root: root})
	if err != nil || rep.Records != 1 {
		t.Fatalf("Replay = %+v, %v; want 1 record", rep, err)
	}
	if got := content(t, m, "t/a.log"); string(got) != "hello" {
		t.Fatalf("a.log = %q after Replay", got)
	}
	after, err := m.ReadDir(walDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("Replay changed the directory's files: %v before, %v after", before, after)
	}
	m.Crash()
	if rep, err := Replay(walDir, Options{FS: m, Root: root}); err != nil || rep.Records != 0 || string(content(t, m, "t/a.log")) != "hello" {
		t.Fatalf("a second Replay after a crash = %+v, %v, a.log %q; want nothing to redo, the data kept", rep, err, content(t, m, "t/a.log"))
	}
	if rep, err := Replay(filepath.Join(root, "none"), Options{FS: m, Root: root}); err != nil || rep != (Replayed{}) {
		t.Fatalf("Replay of a missing directory = %+v, %v", rep, err)
	}
}

// openFailing fails the next n opens of data files (not of the WAL's own) with EMFILE.
type openFailing struct {
	*vfs.Mem
	mu  sync.Mutex
	n   int
	err error // the error of a failed open; EMFILE when nil
}

func (o *openFailing) OpenFile(name string, flag int, perm fs.FileMode) (vfs.File, error) {
	o.mu.Lock()
	fail := o.n > 0 && !strings.HasPrefix(name, walDir)
	if fail {
		o.n--
	}
	err := o.err
	o.mu.Unlock()
	if fail {
		if err == nil {
			err = syscall.EMFILE
		}
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return o.Mem.OpenFile(name, flag, perm)
}

// TestCheckpointRetriesAFailedOpen: a checkpoint that cannot open a data file to sync
// it (out of file descriptors) loses nothing, so it is tried again, reported each time,
// and succeeds once the open does: the WAL does not fail (which would stop the node).
func TestCheckpointRetriesAFailedOpen(t *testing.T) {
	defer func(d time.Duration) { retryWait = d }(retryWait)
	retryWait = 5 * time.Millisecond
	m := &openFailing{Mem: vfs.NewMem()}
	var retries, fails atomic.Int32
	w, _, err := Open(walDir, Options{FS: m, Root: root, FileBytes: 64 << 10,
		OnCheckpointRetry: func(error) { retries.Add(1) }, OnFail: func(error) { fails.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	f := dataFile(t, m.Mem, "a.log")
	write(t, w, f, "a.log", 0, []byte("kept"))
	m.mu.Lock()
	m.n = 3
	m.mu.Unlock()
	if err := w.Checkpoint(); err != nil {
		t.Fatalf("Checkpoint over three failed opens: %v", err)
	}
	if retries.Load() != 3 || fails.Load() != 0 {
		t.Fatalf("%d retries and %d failures, want 3 and 0", retries.Load(), fails.Load())
	}
	write(t, w, f, "a.log", 4, []byte("more"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	m.Crash()
	if got, _ := m.Durable(filepath.Join(root, "a.log")); string(got) != "keptmore" {
		t.Fatalf("a.log after a crash holds %q", got)
	}
}

// TestACheckpointThatCannotOpenForGoodFailsClosed: only a shortage (of descriptors or
// memory) is worth waiting out. A data file that cannot be opened for another reason
// (a file system remounted read-only after an error, a file made unwritable) will not
// open a second later either; the checkpoint retried it every second for ever, and
// once the full files it could not free reached maxFull, every commit of the node
// waited with them, without an error. It fails the WAL closed instead, at once: the
// commits get ErrFailed, the node says why, and the records stay for the next start.
func TestACheckpointThatCannotOpenForGoodFailsClosed(t *testing.T) {
	defer func(d time.Duration) { retryWait = d }(retryWait)
	retryWait = 5 * time.Millisecond
	for _, errno := range []syscall.Errno{syscall.EROFS, syscall.EACCES, syscall.EIO} {
		t.Run(errno.Error(), func(t *testing.T) {
			m := &openFailing{Mem: vfs.NewMem(), err: errno}
			var retries, fails atomic.Int32
			w, _, err := Open(walDir, Options{FS: m, Root: root, FileBytes: 64 << 10,
				OnCheckpointRetry: func(error) { retries.Add(1) }, OnFail: func(error) { fails.Add(1) }})
			if err != nil {
				t.Fatal(err)
			}
			f := dataFile(t, m.Mem, "a.log")
			write(t, w, f, "a.log", 0, []byte("kept"))
			m.mu.Lock()
			m.n = 1 << 30
			m.mu.Unlock()
			done := make(chan error, 1)
			go func() { done <- w.Checkpoint() }()
			select {
			case err := <-done:
				if !errors.Is(err, ErrFailed) || !errors.Is(err, errno) {
					t.Fatalf("Checkpoint: %v, want ErrFailed naming %v", err, errno)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("Checkpoint still waiting after 30 s (%d retries): a data file that cannot be opened for good is retried for ever", retries.Load())
			}
			if retries.Load() != 0 || fails.Load() != 1 {
				t.Errorf("%d retries and %d failures, want 0 and 1", retries.Load(), fails.Load())
			}
			if _, err := f.WriteAt([]byte("more"), 4); err != nil {
				t.Fatal(err)
			}
			if err := w.Commit([]Span{{Path: filepath.Join(root, "a.log"), Off: 4, Data: []byte("more")}}); !errors.Is(err, ErrFailed) {
				t.Fatalf("a commit after the failure: %v, want ErrFailed", err)
			}
			_ = w.Close() // failed: its error is the failure's
			m.Crash()
			m.mu.Lock()
			m.n = 0
			m.mu.Unlock()
			open(t, m.Mem, 64<<10)
			if got := content(t, m.Mem, "a.log"); string(got) != "kept" {
				t.Fatalf("a.log after the next start holds %q, want the committed %q", got, "kept")
			}
		})
	}
}

// removeStops lets the first n removals through, then fails every later one, as a
// process killed part-way through a removal.
type removeStops struct {
	*vfs.Mem
	n int
}

func (r *removeStops) Remove(name string) error {
	if r.n == 0 {
		return errors.New("killed")
	}
	r.n--
	return r.Mem.Remove(name)
}

// TestRemoveFilesIsSafeAtEveryStep: a rollback's fold (Replay, then RemoveFiles) killed
// after any number of removals, then a power cut, then a start of the newer binary
// (the directory still says format 3): the write-ahead file holding records of an
// earlier use under a torn header must never have them replayed over newer data.
// Removing seq, the sequence floor, before that file (an os.RemoveAll lists entries
// in any order) let the next use reuse its sequence (found in review: q.log came back
// as "old-2").
func TestRemoveFilesIsSafeAtEveryStep(t *testing.T) {
	for k := 0; ; k++ {
		m := vfs.NewMem()
		earlierUse(t, m)
		if err := m.FlipByte(filepath.Join(walDir, "00000000.wal"), 13, 0xff); err != nil {
			t.Fatal(err)
		}
		m.Crash()
		if _, err := Replay(walDir, Options{FS: m, Root: root}); err != nil {
			t.Fatal(err)
		}
		err := RemoveFiles(&removeStops{Mem: m, n: k}, walDir)
		m.Crash()
		if got := nextUse(t, m); got != "new-0" {
			t.Fatalf("killed after %d removals: q.log = %q: a record of an earlier use was replayed", k, got)
		}
		if err == nil {
			if k == 0 {
				t.Fatal("RemoveFiles removed nothing")
			}
			return
		}
	}
}

// TestHoldProcessor: with HoldProcessor on the operating system's files, rounds sync
// holding the writer's processor when Go runs two or more; with one, or for
// SlowHoldOff after a slow sync, they sync the plain way. Either way every commit
// returns once its round is synced.
func TestHoldProcessor(t *testing.T) {
	var told atomic.Int64 // OnHoldOff's calls
	w, commit := holdingWAL(t, func(time.Duration) { told.Add(1) })
	// No sync of this disk counts as slow but the one the test says is: a loaded
	// machine's slow sync must not turn the holding off under it.
	w.slowSync, w.stallSync = time.Hour, time.Hour
	runtime.GOMAXPROCS(2)
	commit()
	commit()
	if st := w.Stats(); st.Rounds != 2 || st.Held != 2 {
		t.Fatalf("two processors: %d rounds, %d held; want 2 and 2", st.Rounds, st.Held)
	}
	runtime.GOMAXPROCS(1)
	commit()
	if st := w.Stats(); st.Rounds != 3 || st.Held != 2 {
		t.Fatalf("one processor: %d rounds, %d held; want 3 and 2", st.Rounds, st.Held)
	}
	runtime.GOMAXPROCS(2)
	// Every sync counts as slow from here: the next round still holds (the sync is
	// only known to be slow once it returns), the one after it does not. (The test
	// changes these between commits, which the commit's channels order with the
	// writer.)
	w.slowSync = 0
	commit()
	commit()
	if st := w.Stats(); st.Rounds != 5 || st.Held != 3 || st.HoldOffs != 1 || told.Load() != 1 {
		t.Fatalf("after a slow sync: %d rounds, %d held, %d hold-offs (%d told); want 5, 3 and 1 (1): a plain sync, slow or not, starts none", st.Rounds, st.Held, st.HoldOffs, told.Load())
	}
	w.slowSync, w.holdOff = time.Hour, time.Now() // the hold-off over
	commit()
	if st := w.Stats(); st.Rounds != 6 || st.Held != 4 {
		t.Fatalf("after the hold-off: %d rounds, %d held; want 6 and 4", st.Rounds, st.Held)
	}
	if w.pause != SlowHoldOff {
		t.Fatalf("a slow sync that is no stall changed the pause to %v", w.pause)
	}
	// A Mem FS's files are synced by their own Sync, never counted as held.
	m := vfs.NewMem()
	mw, _, err := Open(walDir, Options{FS: m, Root: root, HoldProcessor: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	write(t, mw, dataFile(t, m, "t/a.log"), "t/a.log", 0, []byte("x"))
	if st := mw.Stats(); st.Rounds != 1 || st.Held != 0 {
		t.Fatalf("Mem: %d rounds, %d held; want 1 and 0", st.Rounds, st.Held)
	}
}

// holdingWAL opens a HoldProcessor WAL on the operating system's files (OnHoldOff
// onHoldOff) with two or more processors until t ends, and returns it with a commit
// of one record (t's failure on an error).
func holdingWAL(t *testing.T, onHoldOff func(time.Duration)) (*WAL, func()) {
	t.Helper()
	procs := runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(max(2, procs))
	t.Cleanup(func() { runtime.GOMAXPROCS(procs) })
	dir := t.TempDir()
	w, _, err := Open(filepath.Join(dir, "wal"), Options{FS: vfs.OS{}, Root: dir, HoldProcessor: true, OnHoldOff: onHoldOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	data := filepath.Join(dir, "a.log")
	f, err := os.Create(data)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	off := int64(0)
	return w, func() {
		t.Helper()
		rec := []byte("record")
		if _, err := f.WriteAt(rec, off); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit([]Span{{Path: data, Off: off, Data: rec}}); err != nil {
			t.Fatal(err)
		}
		off += int64(len(rec))
	}
}

// TestHoldProcessorStalls: a held stall pauses the holding and doubles the next pause
// (up to MaxHoldOff); after a stall, held or plain, the rounds stay plain until one is
// quick and SlowHoldOff has passed since the stall; MaxHoldOff without a stall sets
// the pause back. The test says which syncs are slow or stalls through the
// thresholds, which the commits' channels order with the writer.
func TestHoldProcessorStalls(t *testing.T) {
	w, commit := holdingWAL(t, nil)
	w.slowSync, w.stallSync = 0, 0 // every sync stalls
	start := time.Now()
	commit()
	if st := w.Stats(); st.Held != 1 || st.HoldOffs != 1 {
		t.Fatalf("the first stall: %d held, %d hold-offs; want 1 and 1", st.Held, st.HoldOffs)
	}
	if w.pause != 2*SlowHoldOff || w.holdOff.Before(start.Add(SlowHoldOff)) {
		t.Fatalf("after a held stall: pause %v, hold-off until %v after the commit began; want %v and at least %v",
			w.pause, w.holdOff.Sub(start), 2*SlowHoldOff, SlowHoldOff)
	}
	// The disk stalls on: every plain stall keeps the rounds plain a second more.
	var last time.Time
	for range 3 {
		last = time.Now()
		commit()
	}
	if st := w.Stats(); st.Rounds != 4 || st.Held != 1 || st.HoldOffs != 1 {
		t.Fatalf("plain stalls: %d rounds, %d held, %d hold-offs; want 4, 1 and 1", st.Rounds, st.Held, st.HoldOffs)
	}
	if w.holdOff.Before(last.Add(SlowHoldOff)) {
		t.Fatalf("a plain stall left the hold-off %v after it began; want at least %v", w.holdOff.Sub(last), SlowHoldOff)
	}
	// A disk written seldom: the hold-off passes with no round, and the next one still
	// stalls. It is not held: the last sync stalled.
	w.holdOff = time.Now()
	commit()
	if st := w.Stats(); st.Rounds != 5 || st.Held != 1 || st.Stalls != 5 {
		t.Fatalf("a stall after a quiet hold-off: %d rounds, %d held, %d stalls; want 5, 1 and 5", st.Rounds, st.Held, st.Stalls)
	}
	// One quick sync; the pause over, the next round holds again, and a stall there
	// doubles the pause.
	w.stallSync = time.Hour
	commit()
	if st := w.Stats(); st.Held != 1 {
		t.Fatalf("the first quick sync after stalls: %d held; want it plain", st.Held)
	}
	w.stallSync = 0
	w.holdOff = time.Now()
	start = time.Now()
	commit()
	if st := w.Stats(); st.Held != 2 || st.HoldOffs != 2 {
		t.Fatalf("the second held stall: %d held, %d hold-offs; want 2 and 2", st.Held, st.HoldOffs)
	}
	if w.pause != 4*SlowHoldOff || w.holdOff.Before(start.Add(2*SlowHoldOff)) {
		t.Fatalf("after a second held stall: pause %v, hold-off %v after the commit began; want %v and at least %v",
			w.pause, w.holdOff.Sub(start), 4*SlowHoldOff, 2*SlowHoldOff)
	}
	w.pause = MaxHoldOff
	w.holdOff, w.stalling = time.Now(), false
	commit()
	if st := w.Stats(); st.Held != 3 || w.pause != MaxHoldOff {
		t.Fatalf("a held stall at the longest pause: %d held, pause %v; want 3 and %v", st.Held, w.pause, MaxHoldOff)
	}
	// A quick disk: held rounds, and the pause stays long while the last stall is
	// recent, then goes back to SlowHoldOff.
	w.slowSync, w.stallSync = time.Hour, time.Hour
	w.holdOff, w.stalling = time.Now(), false
	commit()
	if st := w.Stats(); st.Held != 4 || w.pause != MaxHoldOff {
		t.Fatalf("a quick sync after a recent stall: %d held, pause %v; want 4 and %v", st.Held, w.pause, MaxHoldOff)
	}
	w.lastStall = time.Now().Add(-MaxHoldOff)
	commit()
	if st := w.Stats(); st.Held != 5 || w.pause != SlowHoldOff {
		t.Fatalf("a quick sync a minute after the last stall: %d held, pause %v; want 5 and %v", st.Held, w.pause, SlowHoldOff)
	}
}

// TestStalledAfterASlowSync: Stalled reports a disk whose last round took ShedSync or
// more until a round is quick again, or until StalledFor passed with no sync (a disk
// written seldom is not held for stalling by one old sync), whether the rounds hold
// their processor or not.
func TestStalledAfterASlowSync(t *testing.T) {
	for _, hold := range []bool{true, false} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			w, commit := holdingWAL(t, nil)
			w.opts.HoldProcessor = hold
			if commit(); w.Stalled() {
				t.Fatal("Stalled after a quick sync")
			}
			w.shedSync = 0 // every sync is slow
			if commit(); !w.Stalled() {
				t.Fatal("not Stalled after a slow sync")
			}
			// No sync since for StalledFor: the old verdict no longer holds.
			w.roundEnd.Store(int64(time.Since(w.born)-StalledFor)<<1 | 1)
			if w.Stalled() {
				t.Fatalf("Stalled %v after the last (slow) sync ended", StalledFor)
			}
			if commit(); !w.Stalled() {
				t.Fatal("not Stalled after another slow sync")
			}
			w.shedSync = time.Hour
			if commit(); w.Stalled() {
				t.Fatal("Stalled after a quick sync that followed slow ones")
			}
		})
	}
}
