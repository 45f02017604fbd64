package partition

import (
	"fmt"
	iofs "io/fs"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// readFaultFS is a vfs.Mem whose files fail one ReadAt with EIO: the first read of the
// named file (by suffix) at byte position at, once armed. It stands for a transient
// disk error, which must never be taken for damage.
type readFaultFS struct {
	*vfs.Mem
	mu     sync.Mutex
	suffix string
	at     int64
	armed  bool
	failed int
}

func (f *readFaultFS) arm(suffix string, at int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.suffix, f.at, f.armed = suffix, at, true
}

func (f *readFaultFS) OpenFile(name string, flag int, perm iofs.FileMode) (vfs.File, error) {
	file, err := f.Mem.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &readFaultFile{File: file, fs: f, name: name}, nil
}

type readFaultFile struct {
	vfs.File
	fs   *readFaultFS
	name string
}

func (f *readFaultFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	fail := f.fs.armed && off == f.fs.at && strings.HasSuffix(f.name, f.fs.suffix)
	if fail {
		f.fs.armed = false
		f.fs.failed++
	}
	f.fs.mu.Unlock()
	if fail {
		return 0, syscall.EIO
	}
	return f.File.ReadAt(p, off)
}

// TestTransientReadErrorPastDamageIsNotDamage: a record damaged after the log was opened
// (bit rot the open scan did not see) lies in the same index block before a good record.
// A read of the good record looks past the damaged one; if that look meets a transient
// I/O error, the good record must not be taken for damaged and skipped (settled without
// delivery: an acknowledged message silently dropped). Its lease lapses and it is
// delivered later.
func TestTransientReadErrorPastDamageIsNotDamage(t *testing.T) {
	fs := &readFaultFS{Mem: vfs.NewMem()}
	var now int64
	var damaged int
	p := mustOpen(t, fs, func(o *Options) {
		o.Clock = func() int64 { return now }
		o.OnDamaged = func(log string, n int) { damaged += n }
	})
	defer p.Close()
	// Offsets 0..3 are one-digit records; 4 is large, so that a read of it past the
	// damaged record 3 needs a file read of its own; 5..9 are one-digit again.
	for i := 0; i < 10; i++ {
		v := []byte(fmt.Sprint(i))
		if i == 4 {
			v = []byte(strings.Repeat("x", 10000))
		}
		if _, err := p.Append([]segment.Record{{Value: v}}); err != nil {
			t.Fatal(err)
		}
	}
	const seg = "/p/log/00000000000000000000.log"
	if err := fs.FlipByte(seg, 3*oneDigitFrame+20, 0x08); err != nil {
		t.Fatal(err)
	}
	fs.arm("/log/00000000000000000000.log", 4*oneDigitFrame) // where record 4 starts
	ds := leaseAll(t, p)
	got := offsets(ds)
	if fs.failed != 1 {
		t.Fatalf("the injected read error struck %d times, want 1: the test no longer reaches the read past the damage", fs.failed)
	}
	if damaged != 1 {
		t.Fatalf("%d records skipped as damaged after a transient read error, want 1 (offset 3 only); delivered %v", damaged, got)
	}
	for _, d := range ds {
		if err := settleOne(p, d); err != nil {
			t.Fatal(err)
		}
	}
	// The lease of 4 lapses and it comes back.
	now += int64(2 * time.Minute)
	again := offsets(leaseAll(t, p))
	if fmt.Sprint(again) != "[4]" {
		t.Fatalf("after the lease lapsed, delivered %v, want [4]: an undamaged message was dropped", again)
	}
}
