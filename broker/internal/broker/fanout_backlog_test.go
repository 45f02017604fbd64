package broker

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fanoutBacklog attaches c to p with a delay, so that a backlog is in the parent
// before the copy starts, produces it with mk, runs between (the backlog stored) and
// returns the child's log end once it holds want messages or 30 s passed.
func fanoutBacklog(t *testing.T, n int, mk func(i int) []byte, between func(dir string), more int, want uint64) uint64 {
	t.Helper()
	dir := t.TempDir()
	b := mustStartBroker(t, dir)
	defer b.Close()
	ctx := context.Background()
	for _, name := range []string{"p", "c"} {
		if _, err := b.CreateTopic(ctx, TopicSpec{Name: name, Partitions: ref(int32(1))}); err != nil {
			t.Fatal(err)
		}
	}
	// The delay holds the copy back while the backlog is stored.
	if _, err := b.AttachChild(ctx, "p", "c", 3000); err != nil {
		t.Fatal(err)
	}
	ct, err := b.lookup("c")
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := b.Produce(ctx, "p", []Outgoing{{Partition: 0, Value: mk(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if between != nil {
		between(dir)
	}
	for i := n; i < n+more; i++ {
		if _, err := b.Produce(ctx, "p", []Outgoing{{Partition: 0, Value: mk(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for ct.parts()[0].Stats().End < want && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	return ct.parts()[0].Stats().End
}

// TestFanoutReadsOnPastADamagedRecord: a read stops before a damaged record (the next
// read reports it). The copy reads on at once, meets the damage, skips it (a lone
// copy: the single-node rule), and copies what follows. On the old code it waited for
// the parent's next append after the records before the damage: in a quiet topic the
// copy stopped there.
func TestFanoutReadsOnPastADamagedRecord(t *testing.T) {
	t.Parallel()
	small := func(i int) []byte { return []byte(fmt.Sprintf(`"d%02d"`, i)) }
	flip := func(dir string) {
		files, _ := filepath.Glob(filepath.Join(dir, "topics", "*-p", "0", "log", "*.log"))
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if at := bytes.Index(data, []byte(`"d03"`)); at >= 0 {
				fh, err := os.OpenFile(f, os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := fh.WriteAt([]byte{data[at+2] ^ 0x04}, int64(at+2)); err != nil {
					t.Fatal(err)
				}
				_ = fh.Close()
				return
			}
		}
		t.Fatal(`"d03" is in no segment file of the parent`)
	}
	if got := fanoutBacklog(t, 10, small, flip, 10, 19); got != 19 {
		t.Fatalf("the child holds %d copies, want 19 (20 produced, the damaged one skipped)", got)
	}
}
