package broker

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAReadByTimeOnAClosedPartitionIsUnavailable: a replay by time that meets its
// partition closed under it (its topic deleted, its replica moved or rebuilt) answers
// as a replay by offset does, 503 to retry. The look for the time passed the segment
// log's own "closed" up, which matched no error of the broker's and was answered 500.
func TestAReadByTimeOnAClosedPartitionIsUnavailable(t *testing.T) {
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
	if _, _, err := b.Read(ctx, "t", 0, &from, nil, 10); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a read by offset of a closed partition: %v, want ErrUnavailable", err)
	}
	ms := time.Now().Add(-time.Hour).UnixMilli()
	if _, _, err := b.Read(ctx, "t", 0, nil, &ms, 10); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a read by time of a closed partition: %v, want ErrUnavailable (as by offset)", err)
	}
}
