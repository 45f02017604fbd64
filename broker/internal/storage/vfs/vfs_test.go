package vfs

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// testFS runs one behaviour suite over every implementation, so Mem stays a
// faithful stand-in for OS.
func testFS(t *testing.T, f func(t *testing.T, fsys FS, dir string)) {
	t.Run("OS", func(t *testing.T) { f(t, OS{}, t.TempDir()) })
	t.Run("Mem", func(t *testing.T) {
		m := NewMem()
		if err := m.MkdirAll("/data/p0", 0o755); err != nil {
			t.Fatal(err)
		}
		f(t, m, "/data/p0")
	})
}

func mustOpen(t *testing.T, fsys FS, name string, flag int) File {
	t.Helper()
	f, err := fsys.OpenFile(name, flag, 0o644)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	return f
}

func TestFileReadWrite(t *testing.T) {
	testFS(t, func(t *testing.T, fsys FS, dir string) {
		name := filepath.Join(dir, "a.log")
		if _, err := fsys.OpenFile(name, os.O_RDWR, 0); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("open missing: %v", err)
		}
		f := mustOpen(t, fsys, name, os.O_RDWR|os.O_CREATE|os.O_EXCL)
		if _, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644); !errors.Is(err, fs.ErrExist) {
			t.Fatalf("exclusive create of existing file: %v", err)
		}
		if n, err := f.WriteAt([]byte("hello"), 0); n != 5 || err != nil {
			t.Fatalf("write: %d %v", n, err)
		}
		if _, err := f.WriteAt([]byte("world"), 7); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 12)
		n, err := f.ReadAt(buf, 0)
		if n != 12 || err != nil || string(buf) != "hello\x00\x00world" {
			t.Fatalf("read: %d %v %q", n, err, buf)
		}
		if n, err := f.ReadAt(buf, 10); n != 2 || err != io.EOF {
			t.Fatalf("short read: %d %v", n, err)
		}
		if err := f.Truncate(5); err != nil {
			t.Fatal(err)
		}
		if sz, err := f.Size(); sz != 5 || err != nil {
			t.Fatalf("size: %d %v", sz, err)
		}
		if st, err := fsys.Stat(name); err != nil || st.Size != 5 || st.Name != "a.log" {
			t.Fatalf("stat: %+v %v", st, err)
		}
		ro := mustOpen(t, fsys, name, os.O_RDONLY)
		if _, err := ro.WriteAt([]byte("x"), 0); err == nil {
			t.Fatal("write through a read-only handle succeeded")
		}
		if err := ro.Close(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestDirectoryOps(t *testing.T) {
	testFS(t, func(t *testing.T, fsys FS, dir string) {
		for _, n := range []string{"b", "a", "c"} {
			f := mustOpen(t, fsys, filepath.Join(dir, n), os.O_RDWR|os.O_CREATE)
			if _, err := f.WriteAt([]byte(n), 0); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		if err := fsys.MkdirAll(filepath.Join(dir, "sub", "deeper"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := fsys.Rename(filepath.Join(dir, "c"), filepath.Join(dir, "d")); err != nil {
			t.Fatal(err)
		}
		if err := fsys.Remove(filepath.Join(dir, "a")); err != nil {
			t.Fatal(err)
		}
		if err := fsys.Remove(filepath.Join(dir, "a")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("second remove: %v", err)
		}
		if err := fsys.SyncDir(dir); err != nil {
			t.Fatal(err)
		}
		ents, err := fsys.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range ents {
			got = append(got, e.Name)
		}
		if want := "[b d sub]"; fmtList(got) != want {
			t.Fatalf("entries %v, want %s", got, want)
		}
		if _, err := fsys.Stat(filepath.Join(dir, "c")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("stat of renamed-away file: %v", err)
		}
	})
}

// TestRemoveDirectory: an empty directory is removed like a file; one with entries is
// refused. In Mem the removal comes undone in a crash until its parent is synced.
func TestRemoveDirectory(t *testing.T) {
	testFS(t, func(t *testing.T, fsys FS, dir string) {
		sub := filepath.Join(dir, "sub")
		if err := MkdirAllSync(fsys, filepath.Join(sub, "deeper"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := fsys.Remove(sub); err == nil {
			t.Fatal("a directory holding one was removed")
		}
		if err := fsys.Remove(filepath.Join(sub, "deeper")); err != nil {
			t.Fatal(err)
		}
		if _, err := fsys.Stat(filepath.Join(sub, "deeper")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("stat of a removed directory: %v", err)
		}
		m, ok := fsys.(*Mem)
		if !ok {
			return
		}
		for _, d := range []string{"/", "/data", dir} { // testFS made dir without syncs
			if err := m.SyncDir(d); err != nil {
				t.Fatal(err)
			}
		}
		m.Crash()
		if _, err := m.Stat(filepath.Join(sub, "deeper")); err != nil {
			t.Fatalf("a removal never synced did not come undone in a crash: %v", err)
		}
		if err := m.Remove(filepath.Join(sub, "deeper")); err != nil {
			t.Fatal(err)
		}
		if err := m.SyncDir(sub); err != nil {
			t.Fatal(err)
		}
		m.Crash()
		if _, err := m.Stat(filepath.Join(sub, "deeper")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("a synced removal came undone in a crash: %v", err)
		}
	})
}

func fmtList(s []string) string {
	out := "["
	for i, v := range s {
		if i > 0 {
			out += " "
		}
		out += v
	}
	return out + "]"
}

func TestRemovedFileStaysReadable(t *testing.T) {
	testFS(t, func(t *testing.T, fsys FS, dir string) {
		name := filepath.Join(dir, "x")
		f := mustOpen(t, fsys, name, os.O_RDWR|os.O_CREATE)
		f.WriteAt([]byte("still here"), 0)
		if err := fsys.Remove(name); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 10)
		if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != "still here" {
			t.Fatalf("read after unlink: %v %q", err, buf)
		}
		f.Close()
	})
}

func TestMemCrashDropsUnsynced(t *testing.T) {
	m := NewMem()
	MkdirAllSync(m, "/d", 0o755)
	f, _ := m.OpenFile("/d/durable", os.O_RDWR|os.O_CREATE, 0o644)
	f.WriteAt([]byte("synced"), 0)
	f.Sync()
	f.WriteAt([]byte("+lost"), 6)
	m.SyncDir("/d")
	g, _ := m.OpenFile("/d/no-dir-sync", os.O_RDWR|os.O_CREATE, 0o644)
	g.WriteAt([]byte("data"), 0)
	g.Sync()
	m.Rename("/d/durable", "/d/renamed") // not made durable

	m.Crash()
	if _, err := f.ReadAt(make([]byte, 1), 0); !errors.Is(err, ErrCrashed) {
		t.Fatalf("old handle after crash: %v", err)
	}
	got, err := m.ReadFile("/d/durable")
	if err != nil || string(got) != "synced" {
		t.Fatalf("after crash: %q %v", got, err)
	}
	if _, err := m.Stat("/d/no-dir-sync"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("file whose entry was never synced survived: %v", err)
	}
	if _, err := m.Stat("/d/renamed"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("rename without dir sync survived: %v", err)
	}
}

func TestMemCrashTornKeepsPrefix(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 50; i++ {
		m := NewMem()
		MkdirAllSync(m, "/d", 0o755)
		f, _ := m.OpenFile("/d/f", os.O_RDWR|os.O_CREATE, 0o644)
		m.SyncDir("/d")
		f.WriteAt([]byte("abc"), 0)
		f.Sync()
		f.WriteAt([]byte("defgh"), 3)
		m.CrashTorn(r)
		got, _ := m.ReadFile("/d/f")
		if len(got) < 3 || string(got) != "abcdefgh"[:len(got)] {
			t.Fatalf("torn crash kept %q", got)
		}
	}
}

// CrashHoled keeps the synced bytes and every unsynced one but a run of at most one
// sector, zeroed, of the files it picks; the others lose what was not synced.
func TestMemCrashHoledKeepsAllButASector(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	synced := bytes.Repeat([]byte{'s'}, 700)
	unsynced := bytes.Repeat([]byte{'u'}, 2000)
	for i := 0; i < 50; i++ {
		m := NewMem()
		MkdirAllSync(m, "/d", 0o755)
		for _, name := range []string{"/d/holed", "/d/other"} {
			f, _ := m.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
			f.WriteAt(synced, 0)
			f.Sync()
			f.WriteAt(unsynced, int64(len(synced)))
		}
		m.SyncDir("/d")
		m.CrashHoled(r, func(name string) bool { return name == "/d/holed" })
		got, _ := m.ReadFile("/d/holed")
		if len(got) != len(synced)+len(unsynced) || !bytes.Equal(got[:len(synced)], synced) {
			t.Fatalf("holed crash kept %d bytes, want %d with the synced ones intact", len(got), len(synced)+len(unsynced))
		}
		zero := bytes.Count(got, []byte{0})
		if zero == 0 || zero > holeSector || bytes.Count(got, []byte{'u'}) != len(unsynced)-zero {
			t.Fatalf("holed crash zeroed %d bytes, want 1 to %d of the unsynced ones", zero, holeSector)
		}
		if other, _ := m.ReadFile("/d/other"); !bytes.Equal(other, synced) {
			t.Fatalf("a file the crash did not pick kept %d bytes, want only the %d synced", len(other), len(synced))
		}
	}
}

func TestMemFaults(t *testing.T) {
	m := NewMem()
	MkdirAllSync(m, "/d", 0o755)
	f, _ := m.OpenFile("/d/f", os.O_RDWR|os.O_CREATE, 0o644)
	m.SyncDir("/d")
	f.WriteAt([]byte("one"), 0)
	m.FailSync(2)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("two"), 3)
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("armed sync: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fault fired twice: %v", err)
	}
	if m.Syncs() != 3 {
		t.Fatalf("syncs = %d", m.Syncs())
	}

	m.SetFreeSpace(2)
	n, err := f.WriteAt([]byte("xyz"), 6)
	if n != 2 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write past free space: %d %v", n, err)
	}
	if _, err := f.WriteAt([]byte("OV"), 0); err != nil {
		t.Fatalf("overwrite needs no space: %v", err)
	}
	m.SetFreeSpace(-1)

	if err := m.FlipByte("/d/f", 0, 0xff); err != nil {
		t.Fatal(err)
	}
	if err := m.TruncateFile("/d/f", 4); err != nil {
		t.Fatal(err)
	}
	got, _ := m.ReadFile("/d/f")
	if want := string([]byte{'O' ^ 0xff, 'V', 'e', 't'}); string(got) != want {
		t.Fatalf("damaged file %q, want %q", got, want)
	}
	m.Crash()
	got, _ = m.ReadFile("/d/f")
	if want := string([]byte{'o' ^ 0xff, 'n', 'e', 't'}); string(got) != want {
		t.Fatalf("damage did not reach the durable copy: %q, want %q", got, want)
	}
}

// TestMemDropsUnsyncedDirectories: a directory's entry is durable only once its parent is
// synced; a crash before that loses the directory and the synced files inside it.
// MkdirAllSync makes every new entry durable.
func TestMemDropsUnsyncedDirectories(t *testing.T) {
	m := NewMem()
	write := func(name string) {
		t.Helper()
		f, err := m.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt([]byte("x"), 0)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if err := m.SyncDir(filepath.Dir(name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.MkdirAll("/a/b", 0o700); err != nil {
		t.Fatal(err)
	}
	write("/a/b/f")
	if err := MkdirAllSync(m, "/c/d", 0o700); err != nil { // syncs / too, so /a stays, but not /a/b
		t.Fatal(err)
	}
	write("/c/d/f")
	if err := m.MkdirAll("/c/d/e", 0o700); err != nil { // never synced in /c/d
		t.Fatal(err)
	}
	write("/c/d/e/f")
	m.Crash()
	for name, want := range map[string]bool{"/a": true, "/a/b": false, "/a/b/f": false, "/c/d/f": true, "/c/d/e": false, "/c/d/e/f": false} {
		if _, err := m.Stat(name); (err == nil) != want {
			t.Errorf("after a crash, %s: %v; want it there: %v", name, err, want)
		}
	}
	// The synced entry of a directory inside a lost one does not bring it back.
	if err := m.MkdirAll("/g/h", 0o700); err != nil {
		t.Fatal(err)
	}
	m.SyncDir("/g")
	m.Crash()
	if _, err := m.Stat("/g/h"); err == nil {
		t.Error("/g/h survived though /g's entry in / was never synced")
	}
}

// TestWriteFileSyncReplacesWhole: the file ends with exactly the new bytes, private,
// and no temporary file is left beside it.
func TestWriteFileSyncReplacesWhole(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "cursor")
	for _, data := range []string{"first, longer contents\n", "second\n"} {
		if err := WriteFileSync(p, []byte(data)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != data {
			t.Fatalf("read %q, %v; want %q", got, err, data)
		}
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only the file", len(entries))
	}
}

// TestSyncForReading: a missing file is fs.ErrNotExist; an existing one is synced and
// its cached pages dropped, and reads back the same; a directory (not openable for
// writing) is an error.
func TestSyncForReading(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := SyncForReading(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing file: %v", err)
	}
	want := bytes.Repeat([]byte("narad"), 3000)
	if err := os.WriteFile(p, want, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := SyncForReading(p); err != nil {
		t.Fatalf("an existing file: %v", err)
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(want))
	}
	if err := SyncForReading(dir); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a directory: %v", err)
	}
}

// TestDropCache: an OS file drops its pages and reads back the same bytes (from the
// disk); an in-memory file, which has no page cache, is left as it is.
func TestDropCache(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	f, err := OS{}.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := bytes.Repeat([]byte("slot"), 1024)
	if _, err := f.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := DropCache(f); err != nil {
		t.Fatalf("DropCache of an OS file: %v", err)
	}
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back after DropCache: %v", err)
	}
	m := NewMem()
	mf, err := m.OpenFile("/x", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := DropCache(mf); err != nil {
		t.Fatalf("DropCache of an in-memory file: %v", err)
	}
}

// TestMemRenamesADirectory: a directory renamed moves with everything in it, as on a
// disk, and its move is durable once the parents are synced: a crash before that
// brings it back under its old name, whole; after it, it is under the new name, and
// a directory made again under the old name is empty after a crash too. (Mem renamed
// files only: a rename of a directory failed as if the name did not exist.)
func TestMemRenamesADirectory(t *testing.T) {
	setup := func() *Mem {
		m := NewMem()
		if err := MkdirAllSync(m, "/p/log/sub", 0o700); err != nil {
			t.Fatal(err)
		}
		if err := MkdirAllSync(m, "/p/aside", 0o700); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"/p/log/a", "/p/log/sub/b"} {
			f, err := m.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte(name), 0); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if err := m.SyncDir(filepath.Dir(name)); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Rename("/p/log", "/p/aside/log"); err != nil {
			t.Fatal(err)
		}
		return m
	}
	want := func(m *Mem, when string, names map[string]bool) {
		t.Helper()
		for name, there := range names {
			b, err := m.ReadFile(name)
			switch {
			case there && err != nil:
				t.Errorf("%s: %s: %v", when, name, err)
			case there && string(b) != strings.Replace(name, "/aside", "", 1):
				t.Errorf("%s: %s holds %q", when, name, b)
			case !there && err == nil:
				t.Errorf("%s: %s is there", when, name)
			}
		}
	}
	moved := map[string]bool{"/p/aside/log/a": true, "/p/aside/log/sub/b": true, "/p/log/a": false, "/p/log/sub/b": false}
	back := map[string]bool{"/p/aside/log/a": false, "/p/aside/log/sub/b": false, "/p/log/a": true, "/p/log/sub/b": true}

	m := setup()
	want(m, "after the rename", moved)
	m.Crash()
	want(m, "after a crash before any sync", back)

	m = setup()
	if err := m.SyncDir("/p/aside"); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("/p"); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAllSync(m, "/p/log", 0o700); err != nil { // made again, empty
		t.Fatal(err)
	}
	m.Crash()
	want(m, "after a crash once both parents were synced", moved)
	if es, err := m.ReadDir("/p/log"); err != nil || len(es) != 0 {
		t.Errorf("the directory made again under the old name holds %v (%v) after a crash; want it empty", es, err)
	}
	if err := m.Rename("/p", "/p/aside/p"); err == nil {
		t.Error("a directory was renamed into itself")
	}
}
