package broker

import (
	"context"
	"errors"
	"testing"
)

// TestARefusedAlterChangesNoReplicationFactor: a PATCH that carries a replication
// factor with another setting is two control-plane writes. When the other setting is
// refused (here a retention shorter than a delay child's delay plus an hour: 409), the
// replication factor must stay as it was. On the old code the factor was committed
// first: the client was told the request conflicted, and the factor had changed and
// its moves had started.
func TestARefusedAlterChangesNoReplicationFactor(t *testing.T) {
	t.Parallel()
	bs := startReplCluster(t, 3, false)
	ctx := context.Background()
	b := bs[0]
	for _, name := range []string{"p", "c"} {
		if _, err := b.CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr[int32](1), ReplicationFactor: ptr[int32](2)}); err != nil {
			t.Fatal(err)
		}
	}
	pollUntil(t, "the delay child attached", func() error {
		_, err := b.AttachChild(ctx, "p", "c", 60_000)
		return err
	})
	_, err := b.AlterTopic(ctx, "p", TopicAlter{ReplicationFactor: ptr[int32](3), RetentionMs: ptr[int64](1000)})
	var ce *ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("the alter answered %v; want a conflict (retention below the delay child's delay plus an hour)", err)
	}
	m, err := b.TopicMeta("p")
	if err != nil {
		t.Fatal(err)
	}
	if m.ReplicationFactor != 2 {
		t.Errorf("the alter was refused, yet the replication factor is now %d (was 2): the request took effect in part", m.ReplicationFactor)
	}
	// The same change without the refused setting goes through.
	if _, err := b.AlterTopic(ctx, "p", TopicAlter{ReplicationFactor: ptr[int32](3)}); err != nil {
		t.Fatal(err)
	}
	if m, _ := b.TopicMeta("p"); m.ReplicationFactor != 3 {
		t.Errorf("the replication factor is %d after an alter to 3", m.ReplicationFactor)
	}
}
