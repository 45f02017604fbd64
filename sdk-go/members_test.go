package narad_test

import (
	"errors"
	"testing"

	narad "github.com/narad-mq/narad/sdk-go"
)

// TestClusterAndMembers reads a single node's cluster: one alive member, which is the
// node that answered and the controller; decommission and move answer what this broker
// offers (not found for an unknown node, or not implemented).
func TestClusterAndMembers(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	info, err := c.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NodeID == "" || info.Controller != info.NodeID || len(info.Members) != 1 || info.Members[0].ID != info.NodeID {
		t.Fatalf("cluster %+v", info)
	}
	ms, err := c.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].ID != info.NodeID || ms[0].Status != "alive" || ms[0].Address == "" {
		t.Fatalf("members %+v", ms)
	}
	if _, err := c.Decommission(ctx, "no-such-node"); !errors.Is(err, narad.ErrNotFound) && !errors.Is(err, narad.ErrNotImplemented) {
		t.Fatalf("decommission of an unknown node: %v", err)
	}
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	if _, err := c.MovePartition(ctx, topic, 0, info.NodeID, "no-such-node"); err == nil {
		t.Fatal("a move to a node that does not exist succeeded")
	}
}
