package vfs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestKernelAtLeast(t *testing.T) {
	for _, c := range []struct {
		release string
		want    bool
	}{
		{"5.8.0", true}, {"5.7.19", false}, {"6.1.0-18-amd64", true}, {"4.19.0", false},
		{"5.10", true}, {"6.18.44-fc-v595", true}, {"", false}, {"garbage", false}, {"5", false},
	} {
		if got := kernelAtLeast(c.release, 5, 8); got != c.want {
			t.Errorf("kernelAtLeast(%q, 5, 8) = %v, want %v", c.release, got, c.want)
		}
	}
}

// TestSyncHolding: a file OS opened is synced by the raw system call, with
// fdatasync's errors (a pipe cannot be synced: EINVAL; a closed file: an error); a
// file of another FS is left to its own Sync.
func TestSyncHolding(t *testing.T) {
	f, err := OS{}.OpenFile(filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if held, err := SyncHolding(f); !held || err != nil {
		t.Fatalf("SyncHolding of an OS file: held %v, %v", held, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if held, err := SyncHolding(f); !held || err == nil {
		t.Fatalf("SyncHolding of a closed file: held %v, %v; want an error", held, err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if held, err := SyncHolding(osFile{w}); !held || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("SyncHolding of a pipe: held %v, %v; want EINVAL", held, err)
	}
	m := NewMem()
	mf, err := m.OpenFile("/m", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if held, err := SyncHolding(mf); held || err != nil {
		t.Fatalf("SyncHolding of a Mem file: held %v, %v; want false, nil", held, err)
	}
}
