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

// TestFailpointUndoFailsSaysMaybeStored fails a commit group's fsync, once with the
// undo working and once with the undo failing too. Only when the undo worked may the
// caller be told nothing was stored: with a failed undo the records are still in the
// file and a reopen finds them, so the append's error must wrap ErrNotUndone.
func TestFailpointUndoFailsSaysMaybeStored(t *testing.T) {
	defer failpoint.Set("")
	for _, undoFails := range []bool{false, true} {
		m := vfs.NewMem()
		l := mustOpen(t, testDir, memOptions(m))
		appendTestRecords(t, l, 0, 5)
		spec := failpoint.SegmentAfterWrite + ":eio@1"
		if undoFails {
			spec += ";" + failpoint.SegmentUndo + ":eio"
		}
		if err := failpoint.Set(spec); err != nil {
			t.Fatal(err)
		}
		_, err := l.Append(testRecords(5, 8))
		failpoint.Set("")
		if !errors.Is(err, ErrFailed) {
			t.Fatalf("undo fails %v: append returned %v, want ErrFailed", undoFails, err)
		}
		if errors.Is(err, ErrNotUndone) != undoFails {
			t.Fatalf("undo fails %v: append returned %v; ErrNotUndone must be there exactly when the undo failed", undoFails, err)
		}
		if _, err := l.Append(testRecords(0, 1)); !errors.Is(err, ErrFailed) || errors.Is(err, ErrNotUndone) {
			t.Fatalf("undo fails %v: a later append returned %v, want ErrFailed alone (it wrote nothing)", undoFails, err)
		}
		l.Close()
		l = mustOpen(t, testDir, memOptions(m))
		got := len(readAll(t, l))
		mustClose(t, l)
		switch {
		case !undoFails && got != 5:
			t.Fatalf("undo worked, yet a reopen finds %d records, want the 5 acknowledged", got)
		case undoFails && got != 8:
			// This is what makes "nothing was stored" untrue when the undo fails.
			t.Fatalf("undo failed: a reopen finds %d records; the test expects the 3 unacknowledged ones to be back (8)", got)
		}
	}
}
