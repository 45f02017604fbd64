package broker

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestAReadByTimeOnAClosedPartitionIsUnavailable: a replay by time that meets its
// partition closed under it (its topic deleted, its replica moved or rebuilt) answers
// as a replay by offset does, 503 to retry. The look for the time passed the segment
// log's own "closed" up, which matched no error of the broker's and was answered 500.
func TestAReadByTimeOnAClosedPartitionIsUnavailable(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "t", Partitions: ref(int32(1))}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Produce(ctx, "t", []Outgoing{{Partition: 0, Value: []byte("m")}}); err != nil {
		t.Fatal(err)
	}
	pt, err := b.lookup("t")
	if err != nil {
		t.Fatal(err)
	}
	if err := pt.parts()[0].Close(); err != nil {
		t.Fatal(err)
	}
	from := uint64(0)
	if _, _, err := readRange(b, ctx, "t", 0, &from, nil, 10); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a read by offset of a closed partition: %v, want ErrUnavailable", err)
	}
	ms := time.Now().Add(-time.Hour).UnixMilli()
	if _, _, err := readRange(b, ctx, "t", 0, nil, &ms, 10); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a read by time of a closed partition: %v, want ErrUnavailable (as by offset)", err)
	}
}

// TestAReplayReadsPastADamagedMessage: a replay that met a damaged message (its record
// fails its checksum) failed at it with a 503 that every retry met again, so a reader
// of the partition's history could never get past it; the SDKs' replays retried it for
// ever or gave up. A replay read goes past it now and names its offset; a read of that
// one offset still fails.
func TestAReplayReadsPastADamagedMessage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	b := mustStartBroker(t, dir)
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "t", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "t", 10)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	damageRecord(t, filepath.Join(dir, "topics", strconv.FormatUint(m.Incarnation, 10)+"-t"), 3)
	b = mustStartBroker(t, dir)
	defer b.Close()
	var offsets []uint64
	var damaged []uint64
	from := uint64(0)
	for range 5 {
		got, err := b.Read(ctx, "t", 0, ReadSpec{From: &from, Max: 100, SkipDamaged: true})
		if err != nil {
			t.Fatalf("a replay from %d: %v (read so far %v)", from, err, offsets)
		}
		for _, d := range got.Messages {
			offsets = append(offsets, d.Offset)
		}
		damaged = append(damaged, got.Damaged...)
		if got.Incarnation != m.Incarnation {
			t.Fatalf("the answer names incarnation %d, want %d", got.Incarnation, m.Incarnation)
		}
		from = got.Next
		if from == 10 {
			break
		}
	}
	if want := []uint64{0, 1, 2, 4, 5, 6, 7, 8, 9}; !slices.Equal(offsets, want) || !slices.Equal(damaged, []uint64{3}) || from != 10 {
		t.Fatalf("the replay read %v, went past %v as damaged and stopped at %d; want %v, [3] and 10", offsets, damaged, from, want)
	}
	if v := counterValue(t, b.Metrics(), "narad_damaged_records_total"); v < 1 {
		t.Fatalf("narad_damaged_records_total = %v, want the damaged message counted", v)
	}
	if _, err := b.ReadOne(ctx, "t", 0, 3); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a read of the damaged offset alone: %v, want ErrCorrupt", err)
	}
}

// TestAReplayNamingAnIncarnationMeetsNoOtherTopic: a position saved while reading one
// topic, used after the name was deleted and created again, read the new topic's
// messages at those offsets as if they continued the old one (skipping the new
// topic's first ones). A read that names the incarnation it follows is refused.
func TestAReplayNamingAnIncarnationMeetsNoOtherTopic(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	old, err := b.CreateTopic(ctx, TopicSpec{Name: "t", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "t", 3)
	from := uint64(2)
	got, err := b.Read(ctx, "t", 0, ReadSpec{From: &from, Max: 10, Incarnation: old.Incarnation})
	if err != nil || len(got.Messages) != 1 || got.Incarnation != old.Incarnation {
		t.Fatalf("a read naming the topic's own incarnation: %+v, %v", got, err)
	}
	if err := b.DeleteTopic(ctx, "t", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "t", Partitions: ref(int32(1))}); err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "t", 5)
	if got, err := b.Read(ctx, "t", 0, ReadSpec{From: &from, Max: 10, Incarnation: old.Incarnation}); !errors.Is(err, ErrIncarnationMismatch) {
		t.Fatalf("a read naming the deleted incarnation: %d messages, %v; want ErrIncarnationMismatch", len(got.Messages), err)
	}
}
