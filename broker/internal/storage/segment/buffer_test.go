package segment

import (
	"bytes"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestALargeGroupLeavesNoBufferInItsLog: a log keeps its write buffer for the next
// group only while small; a larger one goes to the buffers every log shares (which
// the collector empties when unused). Kept whatever its size, every partition of a
// node held its largest group (a batch of 1,000 messages is about 280 KB) in memory
// for as long as it was open.
func TestALargeGroupLeavesNoBufferInItsLog(t *testing.T) {
	opts := memOptions(vfs.NewMem())
	opts.SegmentBytes = 1 << 20
	l := mustOpen(t, testDir, opts)
	defer mustClose(t, l)
	var big []Record
	for i := range 1000 {
		big = append(big, Record{Timestamp: int64(i), Value: bytes.Repeat([]byte{byte(i)}, 256)})
	}
	first := mustAppend(t, l, big...)
	l.fileMu.Lock()
	c := cap(l.wbuf)
	l.fileMu.Unlock()
	if c > keptGroupBuffer {
		t.Fatalf("a group of 1,000 records left its log a buffer of %d bytes", c)
	}
	mustAppend(t, l, testRecord(1), testRecord(2))
	l.fileMu.Lock()
	c = cap(l.wbuf)
	l.fileMu.Unlock()
	if c == 0 {
		t.Fatal("a small group's buffer was not kept for the next")
	}
	// And another large group after it, through a pooled buffer or a new one.
	mustAppend(t, l, big...)
	got := mustRead(t, l, first, 3000, 1<<30)
	if len(got) != 2002 {
		t.Fatalf("read back %d records, want 2002", len(got))
	}
	for i, r := range got {
		want := big[i%1000]
		switch {
		case i == 1000 || i == 1001:
			want = testRecord(i - 999)
		case i > 1001:
			want = big[i-1002]
		}
		if !bytes.Equal(r.Value, want.Value) || r.Timestamp < want.Timestamp {
			t.Fatalf("record %d (offset %d) read back wrong: %d bytes", i, first+uint64(i), len(r.Value))
		}
	}
}
