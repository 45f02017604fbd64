package segment

import (
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestFlushMakesNoSyncLogDurable: a log opened with NoSync loses what it wrote at a
// power loss, unless Flush ran after the write; then every record up to the flush
// survives, across many segment files.
func TestFlushMakesNoSyncLogDurable(t *testing.T) {
	for _, flush := range []bool{false, true} {
		m := vfs.NewMem()
		// The log makes its own directory, without a sync (NoSync): Flush must make
		// the directory's entry durable too.
		if err := vfs.MkdirAllSync(m, filepath.Dir(testDir), 0o755); err != nil {
			t.Fatal(err)
		}
		opts := memOptions(m)
		opts.NoSync = true
		l := mustOpen(t, testDir, opts)
		appendTestRecords(t, l, 0, 40) // more than a segment
		if l.Stats().Segments < 2 {
			t.Fatalf("want several segments, got %d", l.Stats().Segments)
		}
		if flush {
			if err := l.Flush(); err != nil {
				t.Fatalf("Flush: %v", err)
			}
		}
		m.Crash()
		l2 := mustOpen(t, testDir, opts)
		got := l2.Next()
		mustClose(t, l2)
		if flush && got != 40 {
			t.Fatalf("after Flush and a power loss the log ends at %d, want 40", got)
		}
		if !flush && got == 40 {
			t.Fatalf("without Flush the NoSync log kept every record through a power loss: the test cannot tell Flush's work")
		}
		if flush {
			l3 := mustOpen(t, testDir, opts)
			checkRecords(t, readAll(t, l3), testRecords(0, 40))
			mustClose(t, l3)
		}
	}
}
