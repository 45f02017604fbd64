package partition

import (
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestAFailedCheckpointKeepsTheJournalItWouldCover: a checkpoint drops the settle
// journal's segments only once the checkpoint that covers them is durable. Had it
// dropped them first, a checkpoint whose write failed (here its fsync: EIO), or a
// power cut before its rename, would leave the old checkpoint naming a journal
// position whose segments are gone: the next start refuses to open the partition (the
// journal starts after the checkpoint's position), and the acks those segments held
// are lost. A checkpoint drops only sealed segments; the journal's are 4 MiB, so this
// test writes its settles with small segments, as a long-lived journal has many.
func TestAFailedCheckpointKeepsTheJournalItWouldCover(t *testing.T) {
	const n = 100
	fs := vfs.NewMem()
	p := mustOpen(t, fs)
	appendN(t, p, n)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	j, err := segment.Open("/p/journal", segment.Options{FS: fs, SegmentBytes: 256})
	if err != nil {
		t.Fatal(err)
	}
	for o := range uint64(n) { // every message acked, one settle record each
		if _, err := j.Append([]segment.Record{{Value: encodeSettle([]uint64{o})}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	segments := func() int {
		ents, err := fs.ReadDir("/p/journal")
		if err != nil {
			t.Fatal(err)
		}
		c := 0
		for _, e := range ents {
			if strings.HasSuffix(e.Name, ".log") {
				c++
			}
		}
		return c
	}
	before := segments()
	if before < 2 {
		t.Fatalf("the journal has %d segment(s); the test needs sealed ones", before)
	}

	p = mustOpen(t, fs)
	if st := p.Stats(); st.Frontier != n {
		t.Fatalf("frontier %d after replaying the journal, want %d", st.Frontier, n)
	}
	fs.FailSync(1) // the checkpoint's file is the next one synced: its fsync fails
	if err := p.Checkpoint(); err == nil {
		t.Fatal("a checkpoint whose fsync failed reported success")
	}
	if got := segments(); got != before {
		t.Errorf("a checkpoint that failed dropped journal segments: %d of %d left", got, before)
	}
	fs.Crash()
	_ = p.closeFiles()

	p, err = Open(Options{Dir: "/p", FS: fs, Queue: testQueue})
	if err != nil {
		t.Fatalf("reopening after a failed checkpoint: %v", err)
	}
	defer p.Close()
	if st := p.Stats(); st.Frontier != n {
		t.Errorf("frontier %d after the restart, want %d (every message was acked)", st.Frontier, n)
	}
	if ds := leaseAll(t, p); len(ds) != 0 {
		t.Errorf("%d acked messages delivered again after the restart, the first at offset %d", len(ds), ds[0].Record.Offset)
	}
}
