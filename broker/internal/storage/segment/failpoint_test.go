//go:build failpoints

package segment

import (
	"errors"
	"syscall"
	"testing"

	"github.com/narad-mq/narad/broker/internal/failpoint"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestFailpointFsyncEIO fails the fsync of a commit group that rolls into a new segment
// (an EIO at segment-after-write on the new segment's chunk): the append must fail, the
// log must fail closed, and a reopen must show exactly the records acknowledged before.
func TestFailpointFsyncEIO(t *testing.T) {
	for _, at := range []int{1, 2, 5} {
		m := vfs.NewMem()
		l := mustOpen(t, testDir, memOptions(m))
		appendTestRecords(t, l, 0, 20)
		want := readAll(t, l)
		if err := failpoint.Set(failpoint.SegmentAfterWrite + ":eio@" + string(rune('0'+at))); err != nil {
			t.Fatal(err)
		}
		var failed error
		for i := 20; i < 60 && failed == nil; i++ {
			if _, err := l.Append(testRecords(i, i+3)); err != nil {
				failed = err
				break
			}
			want = readAll(t, l)
		}
		failpoint.Set("")
		if !errors.Is(failed, ErrFailed) || !errors.Is(failed, syscall.EIO) {
			t.Fatalf("@%d: append after an injected EIO returned %v, want ErrFailed wrapping EIO", at, failed)
		}
		if _, err := l.Append(testRecords(0, 1)); !errors.Is(err, ErrFailed) {
			t.Fatalf("@%d: the log did not fail closed: %v", at, err)
		}
		l.Close()
		l = mustOpen(t, testDir, memOptions(m))
		checkRecords(t, readAll(t, l), want)
		mustClose(t, l)
	}
}
