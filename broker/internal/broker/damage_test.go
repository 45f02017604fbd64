package broker

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFanoutSkipsDamagedParentRecord: a parent record that fails its checksum can never be
// copied. Fan-out must skip it (logged and counted) and go on copying the rest, not retry
// it forever and stop copying that parent.
func TestFanoutSkipsDamagedParentRecord(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	b := mustStartBroker(t, dir)
	for _, name := range []string{"p", "c"} {
		if _, err := b.CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr[int32](1)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.AttachChild(ctx, "p", "c", 0); err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "p", 10)
	childEnd := func(b *Broker) uint64 {
		_, parts, err := b.Topic("c")
		if err != nil {
			t.Fatal(err)
		}
		return parts[0].Stats.End
	}
	for deadline := time.Now().Add(30 * time.Second); childEnd(b) < 10; {
		if time.Now().After(deadline) {
			t.Fatalf("child holds %d of 10 copies", childEnd(b))
		}
		time.Sleep(10 * time.Millisecond) // polling for the copier
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Copy again from the attach point (a lost cursor), over a damaged parent record 3.
	ents, _ := os.ReadDir(filepath.Join(dir, "topics"))
	for _, e := range ents {
		switch {
		case strings.HasSuffix(e.Name(), "-c"):
			if err := os.RemoveAll(filepath.Join(dir, "topics", e.Name(), "fanout")); err != nil {
				t.Fatal(err)
			}
		case strings.HasSuffix(e.Name(), "-p"):
			damageRecord(t, filepath.Join(dir, "topics", e.Name()), 3)
		}
	}
	b = mustStartBroker(t, dir)
	defer b.Close()
	produceN(t, b, "p", 1) // offset 10, and a wake-up for the copier
	// 10 copies before, then 0-2 and 4-10.
	for deadline := time.Now().Add(30 * time.Second); childEnd(b) < 20; {
		if time.Now().After(deadline) {
			t.Fatalf("child holds %d copies, want 20: fan-out stopped at the damaged parent record", childEnd(b))
		}
		time.Sleep(10 * time.Millisecond) // polling for the copier
	}
	if v := counterValue(t, b.Metrics(), "narad_damaged_records_total"); v < 1 {
		t.Fatalf("narad_damaged_records_total = %v, want the skipped copy counted", v)
	}
}

// damageRecord flips a bit in the timestamp of record n of partition 0's first
// segment under the topic directory tdir (the node stopped), so that it fails its
// checksum.
func damageRecord(t *testing.T, tdir string, n int) {
	t.Helper()
	seg := filepath.Join(tdir, "0", "log", "00000000000000000000.log")
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	pos := 0
	for i := 0; i < n; i++ {
		pos += int(binary.LittleEndian.Uint32(data[pos:])) + 4
	}
	data[pos+20] ^= 0x01
	if err := os.WriteFile(seg, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
