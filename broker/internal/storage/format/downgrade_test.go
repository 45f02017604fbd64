package format

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// formatThreeDir makes a data directory of format 3 whose write-ahead file holds a
// record not in its data file, as a node killed after the commit and before the
// checkpoint leaves it: the record says "hello", the file holds "xxxxx".
func formatThreeDir(t *testing.T) (dir, data string) {
	t.Helper()
	dir = t.TempDir()
	if _, err := Prepare(dir, Options{WrittenBy: "narad test", Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
	data = filepath.Join(dir, "topics", "1-t", "0", "log", "00000000000000000000.log")
	if err := os.MkdirAll(filepath.Dir(data), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(data, []byte("xxxxx"), 0o600); err != nil {
		t.Fatal(err)
	}
	w, _, err := wal.Open(filepath.Join(dir, "wal"), wal.Options{FS: vfs.OS{}, Root: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Commit([]wal.Span{{Path: data, Off: 0, Data: []byte("hello")}}); err != nil {
		t.Fatal(err)
	}
	// The WAL is left open, never closed: a crash. (Its goroutines idle until the
	// test binary ends.)
	return dir, data
}

// TestDowngradeFoldsTheWriteAheadFile: format 3 to 2 redoes the write-ahead file's
// records into their data files, removes wal/ and writes format 2; this binary then
// upgrades the directory again at its next start.
func TestDowngradeFoldsTheWriteAheadFile(t *testing.T) {
	dir, data := formatThreeDir(t)
	res, err := Downgrade(dir, 2, Options{WrittenBy: "narad test", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Found != 3 {
		t.Errorf("Downgrade found format %d, want 3", res.Found)
	}
	if b, err := os.ReadFile(data); err != nil || string(b) != "hello" {
		t.Fatalf("the data file holds %q (%v) after the downgrade; want the write-ahead record's \"hello\"", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "wal")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("wal/ after the downgrade: %v; want it removed (a binary of format 2 does not know it)", err)
	}
	if st := mustRead(t, dir); st != (Stamp{Format: 2, WrittenBy: "narad test (downgrade)"}) {
		t.Fatalf("FORMAT = %+v, want format 2 written by the downgrade", st)
	}
	// Twice is harmless.
	if res, err := Downgrade(dir, 2, Options{Logger: quiet()}); err != nil || res.Found != 2 || res.Folded {
		t.Fatalf("a second downgrade to 2 = %+v, %v; want nothing done", res, err)
	}
	if res, err := Prepare(dir, Options{WrittenBy: "narad test", Logger: quiet()}); err != nil || !res.Upgraded || mustRead(t, dir).Format != Current {
		t.Fatalf("the next start = %+v, %v; want the directory upgraded to %d again", res, err, Current)
	}
}

// TestDowngradeLeavesWhatItReadsDurable: a node killed with -9 leaves writes in the
// page cache that no write-ahead record covers: an append or a Raft term and vote
// written, its commit not made yet; a file renamed into place, its directory not
// synced. This binary makes such writes durable when it starts, before it reads
// them; a binary of format 2 does not, and would act on what a power loss can still
// take back (serve a message and take its ack, then lose the message; vote twice in
// a term). So the downgrade leaves every file and directory as durable as it reads.
func TestDowngradeLeavesWhatItReadsDurable(t *testing.T) {
	m := vfs.NewMem()
	dir := "/data"
	logged := filepath.Join(dir, "topics", "1-t", "0", "log", "00000000000000000000.log")
	killed := filepath.Join(dir, "topics", "1-t", "1", "log", "00000000000000000000.log")
	state := filepath.Join(dir, "topics", "2-r", "0", "raft", "state")
	identity := filepath.Join(dir, "meta", "identity.json")
	for _, f := range []string{logged, killed, state} {
		if err := vfs.MkdirAllSync(m, filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name string, off int64, b string, sync bool) {
		t.Helper()
		f, err := m.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte(b), off); err != nil {
			t.Fatal(err)
		}
		if sync {
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write(logged, 0, "acked", true)
	write(killed, 0, "acked", true)
	write(state, 0, "term 1", true)
	if err := m.SyncDir(filepath.Dir(logged)); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir(filepath.Dir(killed)); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir(filepath.Dir(state)); err != nil {
		t.Fatal(err)
	}
	w, _, err := wal.Open(filepath.Join(dir, "wal"), wal.Options{FS: m, Root: dir})
	if err != nil {
		t.Fatal(err)
	}
	write(logged, 5, "+wal", false) // the append's bytes, then its record
	if err := w.Commit([]wal.Span{{Path: logged, Off: 5, Data: []byte("+wal")}}); err != nil {
		t.Fatal(err)
	}
	// Killed before their commits, and a file renamed into a directory never synced.
	// (The WAL is left open, never closed: a crash.)
	write(killed, 5, "+killed", false)
	write(state, 0, "term 2", false)
	if err := m.MkdirAll(filepath.Dir(identity), 0o700); err != nil {
		t.Fatal(err)
	}
	write(identity, 0, `{"id":"n1"}`, true)
	read := map[string]string{}
	for _, f := range []string{logged, killed, state, identity} {
		b, err := m.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		read[f] = string(b)
	}
	if err := fold(m, dir, quiet()); err != nil {
		t.Fatal(err)
	}
	m.Crash() // a power cut after the downgrade, before the older binary's first sync
	for f, want := range read {
		if b, err := m.ReadFile(f); err != nil || string(b) != want {
			t.Errorf("after the downgrade and a power cut %s holds %q (%v); the downgrade read %q", f, b, err, want)
		}
	}
	if _, err := m.Stat(filepath.Join(dir, "wal")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("wal/ after the downgrade and a power cut: %v; want it gone", err)
	}
}

// TestDowngradeFoldsALeftoverWriteAheadFile: a directory at the format asked for
// already, with a wal/ beside it (none of our binaries leaves one, a directory put
// together by hand may), has the records folded into the files and says so.
func TestDowngradeFoldsALeftoverWriteAheadFile(t *testing.T) {
	dir, data := formatThreeDir(t)
	if err := write(dir, Stamp{Format: 2, WrittenBy: "by hand"}, nil); err != nil {
		t.Fatal(err)
	}
	res, err := Downgrade(dir, 2, Options{Logger: quiet()})
	if err != nil || res.Found != 2 || !res.Folded {
		t.Fatalf("Downgrade = %+v, %v; want format 2 found and the write-ahead file folded", res, err)
	}
	if b, _ := os.ReadFile(data); string(b) != "hello" {
		t.Fatalf("the data file holds %q; want the record's \"hello\"", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "wal")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("wal/ after the fold: %v", err)
	}
}

// TestDowngradeRefusesARunningNode: a node that runs holds the data directory's lock
// (and, a binary from before that lock, its control-plane store's); the downgrade
// changes nothing and says to stop the node.
func TestDowngradeRefusesARunningNode(t *testing.T) {
	dir, data := formatThreeDir(t)
	unlock, err := Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Lock(dir); !errors.Is(err, ErrInUse) {
		t.Fatalf("a second Lock of a locked directory answered %v; want ErrInUse", err)
	}
	if _, err := Downgrade(dir, 2, Options{Logger: quiet()}); !errors.Is(err, ErrInUse) {
		t.Fatalf("a downgrade of a locked directory answered %v; want ErrInUse", err)
	}
	unlock()
	store := filepath.Join(dir, "meta", "raft.db")
	if err := os.MkdirAll(filepath.Dir(store), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(store, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	_, err = Downgrade(dir, 2, Options{Logger: quiet()})
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("a downgrade of a directory whose store is locked answered %v; want ErrInUse", err)
	}
	if st := mustRead(t, dir); st.Format != 3 {
		t.Fatalf("FORMAT = %+v after a refused downgrade", st)
	}
	if b, _ := os.ReadFile(data); string(b) != "xxxxx" {
		t.Fatalf("a refused downgrade replayed the write-ahead file: %q", b)
	}
	// Once the node is gone, it runs.
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Downgrade(dir, 2, Options{Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
}

// TestDowngradeRefusals: what cannot be undone in place, or is newer than the binary
// knows, is refused with nothing changed; a directory already at the format (or
// older) is left as it is.
func TestDowngradeRefusals(t *testing.T) {
	dir, data := formatThreeDir(t)
	if _, err := Downgrade(dir, 1, Options{Logger: quiet()}); !errors.Is(err, ErrNoDowngrade) {
		t.Errorf("a downgrade to format 1 answered %v; want ErrNoDowngrade (only a backup goes back past format 2)", err)
	}
	if _, err := Downgrade(dir, 0, Options{Logger: quiet()}); !errors.Is(err, ErrNoDowngrade) {
		t.Errorf("a downgrade to format 0 answered %v; want ErrNoDowngrade", err)
	}
	if st := mustRead(t, dir); st.Format != 3 {
		t.Fatalf("FORMAT = %+v after refused downgrades", st)
	}
	if b, _ := os.ReadFile(data); string(b) != "xxxxx" {
		t.Fatalf("a refused downgrade replayed the write-ahead file: %q", b)
	}
	for _, to := range []int{3, 4} {
		if res, err := Downgrade(dir, to, Options{Logger: quiet()}); err != nil || res.Found != 3 || mustRead(t, dir).Format != 3 {
			t.Errorf("a downgrade to %d of a format-3 directory = %+v, %v; want nothing done", to, res, err)
		}
	}
	newer := t.TempDir()
	if err := Write(newer, Stamp{Format: Current + 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := Downgrade(newer, 2, Options{Logger: quiet()}); !errors.Is(err, ErrTooNew) {
		t.Errorf("a downgrade of format %d answered %v; want ErrTooNew", Current+1, err)
	}
	if _, err := Downgrade(t.TempDir(), 2, Options{Logger: quiet()}); err == nil {
		t.Error("a downgrade of an empty directory succeeded; want an error naming --data-dir")
	}
}

// TestDowngradeErrorsSayWhatToDo: a FORMAT that cannot be written after every undo
// ran (here a leftover FORMAT.tmp that is a directory) leaves the directory at its
// format and says to run the downgrade again, which then finishes; a data directory
// that is a file is named as a wrong --data-dir.
func TestDowngradeErrorsSayWhatToDo(t *testing.T) {
	dir, data := formatThreeDir(t)
	tmp := filepath.Join(dir, FileName+".tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Downgrade(dir, 2, Options{Logger: quiet()})
	if err == nil || !strings.Contains(err.Error(), "run the downgrade again") {
		t.Fatalf("a downgrade that could not write FORMAT answered %v; want an error saying to run it again", err)
	}
	if st := mustRead(t, dir); st.Format != 3 {
		t.Fatalf("FORMAT = %+v after it could not be written", st)
	}
	if err := os.RemoveAll(tmp); err != nil {
		t.Fatal(err)
	}
	if _, err := Downgrade(dir, 2, Options{Logger: quiet()}); err != nil || mustRead(t, dir).Format != 2 {
		t.Fatalf("the downgrade run again: %v, FORMAT %+v; want format 2", err, mustRead(t, dir))
	}
	if b, _ := os.ReadFile(data); string(b) != "hello" {
		t.Fatalf("the data file holds %q; want the record's \"hello\"", b)
	}
	if _, err := Downgrade(data, 2, Options{Logger: quiet()}); err == nil || !strings.Contains(err.Error(), "is not a directory: check --data-dir") {
		t.Errorf("a downgrade of a file answered %v; want it named as a wrong --data-dir", err)
	}
}

// TestEveryStepAboveTwoCanBeUndone: a format step added later without an undo would
// make a rollback across it need a backup; the docs promise otherwise from format 2 on.
func TestEveryStepAboveTwoCanBeUndone(t *testing.T) {
	for _, s := range steps {
		if s.to > 2 && s.down == nil {
			t.Errorf("the step to format %d has no undo (down); write one, or change docs/operating/upgrades.md", s.to)
		}
	}
}

// TestDowngradeKeepsTheDirectoryOwner: run as root on a directory the broker's user
// owns, the downgrade gives FORMAT to that user (a root-owned 0600 FORMAT would stop the
// node from starting). Not as root, it changes no owner.
func TestDowngradeKeepsTheDirectoryOwner(t *testing.T) {
	dir, _ := formatThreeDir(t)
	if os.Geteuid() != 0 {
		if own := ownerOf(dir); own != nil {
			t.Fatalf("ownerOf as uid %d = %+v; want nil (only root gives files away)", os.Geteuid(), own)
		}
		return
	}
	const nobody = 65534
	if err := os.Chown(dir, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if _, err := Downgrade(dir, 2, Options{Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != nobody || st.Gid != nobody {
		t.Fatalf("FORMAT is owned by %d:%d after a downgrade as root; want the directory's owner %d:%d", st.Uid, st.Gid, nobody, nobody)
	}
}

// TestDowngradeWritesFormatLast: FORMAT changes only after every undo succeeded, so an
// undo that fails (or a crash during one) leaves the directory at its format, which
// the newer binary reads; each undo sees the directory still at that format.
func TestDowngradeWritesFormatLast(t *testing.T) {
	dir := t.TempDir()
	if err := write(dir, Stamp{Format: 4, WrittenBy: "narad test"}, nil); err != nil {
		t.Fatal(err)
	}
	var seen []int
	undo := func(fail bool) func(string, *slog.Logger) error {
		return func(d string, _ *slog.Logger) error {
			seen = append(seen, mustRead(t, d).Format)
			if fail {
				return errors.New("injected")
			}
			return nil
		}
	}
	fake := []step{{to: 2, down: undo(false)}, {to: 3, down: undo(true)}, {to: 4, down: undo(false)}}
	if _, err := downgrade(dir, 1, Options{Logger: quiet()}, 4, fake); err == nil {
		t.Fatal("a failed undo was not reported")
	}
	if len(seen) != 2 || seen[0] != 4 || seen[1] != 4 {
		t.Fatalf("the undos saw formats %v; want 4 and 4 (the undo of 4, then the failing one of 3)", seen)
	}
	if st := mustRead(t, dir); st.Format != 4 {
		t.Fatalf("FORMAT = %+v after a failed undo; want 4", st)
	}
	seen = nil
	fake[1].down = undo(false)
	if _, err := downgrade(dir, 1, Options{Logger: quiet()}, 4, fake); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 3 || mustRead(t, dir).Format != 1 {
		t.Fatalf("undos saw %v, FORMAT %+v; want three undos at 4, then format 1", seen, mustRead(t, dir))
	}
}

// unreadable is a vfs.Mem whose directory lost+found may not be read, as for a node's
// user at a file system's root.
type unreadable struct{ *vfs.Mem }

func (u unreadable) ReadDir(dir string) ([]vfs.FileInfo, error) {
	if filepath.Base(dir) == "lost+found" {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: syscall.EACCES}
	}
	return u.Mem.ReadDir(dir)
}

// TestDowngradeSyncsPastWhatIsNotTheNodes: a data directory at a file system's root
// holds lost+found, which the node's user may not read; the downgrade's sync of every
// file passes it by instead of failing.
func TestDowngradeSyncsPastWhatIsNotTheNodes(t *testing.T) {
	m := vfs.NewMem()
	dir := "/data"
	for _, d := range []string{filepath.Join(dir, "lost+found"), filepath.Join(dir, "topics")} {
		if err := vfs.MkdirAllSync(m, d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	f, err := m.OpenFile(filepath.Join(dir, "topics", "x"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if err := fold(unreadable{m}, dir, quiet()); err != nil {
		t.Fatalf("the downgrade's sync failed on lost+found: %v", err)
	}
	if b, err := m.Durable(filepath.Join(dir, "topics", "x")); err != nil || string(b) != "x" {
		t.Fatalf("topics/x after the sync: %q (%v); want it durable", b, err)
	}
}
