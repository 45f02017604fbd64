package broker

import (
	"context"
	"errors"
	"testing"
)

// parentAndChild starts a cluster of three and creates topics p and c there, each of
// replication factor 2, for c to be attached to p; it returns the first node.
func parentAndChild(t *testing.T) *Broker {
	t.Helper()
	b := startReplCluster(t, 3, false)[0]
	for _, name := range []string{"p", "c"} {
		if _, err := b.CreateTopic(context.Background(), TopicSpec{Name: name, Partitions: ptr[int32](1), ReplicationFactor: ptr[int32](2)}); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// TestARefusedAlterChangesNoReplicationFactor: a PATCH that carries a replication
// factor with another setting was two control-plane writes (one since cluster version
// 4). When the other setting is refused (here a retention shorter than a delay child's
// delay plus an hour: 409), the replication factor must stay as it was. On the old
// code the factor was committed first: the client was told the request conflicted, and
// the factor had changed and its moves had started.
func TestARefusedAlterChangesNoReplicationFactor(t *testing.T) {
	t.Parallel()
	b := parentAndChild(t)
	ctx := context.Background()
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

// TestAnAlterWithAReplicationFactorIsOneCommand: a PATCH with a replication factor and
// another setting is refused or applied whole. A conflict that arises after the alter
// was checked (here a delay child attached just before the commit, which makes the new
// retention too short) refuses all of it at cluster version 4. On the old code, two
// commands, the factor was committed before the settings' conflict: the client was
// told 409 and the factor had changed. A cluster held at version 3 still takes such an
// alter as two commands.
func TestAnAlterWithAReplicationFactorIsOneCommand(t *testing.T) {
	b := parentAndChild(t)
	ctx := context.Background()
	hook := func(topic string) {
		if topic != "p" {
			return
		}
		pollUntil(t, "the delay child attached", func() error {
			_, err := b.AttachChild(ctx, "p", "c", 60_000)
			return err
		})
	}
	alterCommitHook.Store(&hook)
	defer alterCommitHook.Store(nil)
	_, err := b.AlterTopic(ctx, "p", TopicAlter{ReplicationFactor: ptr[int32](3), RetentionMs: ptr[int64](1000)})
	alterCommitHook.Store(nil)
	var ce *ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("the alter answered %v; want a conflict (retention below the delay child's delay plus an hour, attached before the commit)", err)
	}
	m, err := b.TopicMeta("p")
	if err != nil {
		t.Fatal(err)
	}
	if m.ReplicationFactor != 2 || m.RetentionMs == 1000 {
		t.Errorf("the alter was refused, yet the replication factor is %d (was 2) and the retention %d ms: the request took effect in part", m.ReplicationFactor, m.RetentionMs)
	}
	// Both at once when nothing conflicts.
	if _, err := b.AlterTopic(ctx, "c", TopicAlter{ReplicationFactor: ptr[int32](3), VisibilityMs: ptr[int64](45_000)}); err != nil {
		t.Fatal(err)
	}
	if m, _ := b.TopicMeta("c"); m.ReplicationFactor != 3 || m.VisibilityMs != 45_000 {
		t.Errorf("after an alter to replication factor 3 and visibility 45 s the topic has %d and %d ms", m.ReplicationFactor, m.VisibilityMs)
	}
	// A factor beyond the nodes is refused whole too.
	_, err = b.AlterTopic(ctx, "c", TopicAlter{ReplicationFactor: ptr[int32](4), VisibilityMs: ptr[int64](50_000)})
	if !errors.As(err, &ce) {
		t.Fatalf("an alter to replication factor 4 on 3 nodes answered %v; want a conflict", err)
	}
	if m, _ := b.TopicMeta("c"); m.ReplicationFactor != 3 || m.VisibilityMs != 45_000 {
		t.Errorf("a refused alter left replication factor %d and visibility %d ms (want 3 and 45000)", m.ReplicationFactor, m.VisibilityMs)
	}

	// At cluster version 3: two commands, both applied.
	old, _ := startHookedReplClusterAt(t, []int{3, 3, 3}, false)
	if _, err := old[0].CreateTopic(ctx, TopicSpec{Name: "v3", Partitions: ptr[int32](1), ReplicationFactor: ptr[int32](2)}); err != nil {
		t.Fatal(err)
	}
	if _, err := old[0].AlterTopic(ctx, "v3", TopicAlter{ReplicationFactor: ptr[int32](3), VisibilityMs: ptr[int64](45_000)}); err != nil {
		t.Fatal(err)
	}
	if m, _ := old[0].TopicMeta("v3"); m.ReplicationFactor != 3 || m.VisibilityMs != 45_000 {
		t.Errorf("at cluster version 3, after an alter to replication factor 3 and visibility 45 s the topic has %d and %d ms", m.ReplicationFactor, m.VisibilityMs)
	}
}
