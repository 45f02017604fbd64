package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// The tests of this file come from an adversarial review of the ack path (6 December).

// replLeasedOne creates topic name (one partition, three replicas, a visibility timeout
// of a minute) on the replicated cluster bs, produces one message and leases it
// through the partition's leader; it returns the delivery and the leader's index.
func replLeasedOne(t *testing.T, bs []*Broker, name string) (Delivered, int) {
	t.Helper()
	ctx := context.Background()
	if _, err := bs[0].CreateTopic(ctx, TopicSpec{Name: name, Partitions: ptr[int32](1), ReplicationFactor: ptr[int32](3), VisibilityMs: ptr[int64](60_000)}); err != nil {
		t.Fatal(err)
	}
	lead := -1
	waitOrFail(t, 60*time.Second, "the partition has a leader every node knows", func() error {
		lead = leaderIndex(bs, name, 0)
		if lead < 0 {
			return errors.New("no leader")
		}
		for _, b := range bs {
			tp, err := b.lookup(name)
			if err != nil {
				return err
			}
			if b.holderOf(tp, 0) != bs[lead].opts.NodeID && !tp.leads(0) {
				return fmt.Errorf("node %s does not know the leader yet", b.opts.NodeID)
			}
		}
		return nil
	})
	waitOrFail(t, 30*time.Second, "the produce", func() error {
		_, err := bs[lead].Produce(ctx, name, []Outgoing{{Value: []byte("m")}})
		return err
	})
	var d Delivered
	waitOrFail(t, 30*time.Second, "the consume", func() error {
		ds, err := bs[lead].Consume(ctx, name, 1, 100*time.Millisecond)
		if err != nil {
			return err
		}
		if len(ds) == 0 {
			return errors.New("nothing delivered yet")
		}
		d = ds[0]
		return nil
	})
	return d, lead
}

// TestAForwardedAckDuringAHandoverFollowsTheLeadership: a leader handing its
// partition over (its live leases committed for the successor, the transfer about to
// begin) answers an ack not-leader, so that it goes to the successor, which holds the
// lease (replication.md: "Extends, hand-backs and acks during the handover go to the
// next leader (the old one answers not-leader until the transfer completes, and the
// routing tries again)"). An ack that reaches the leader forwarded from another node
// gets that not-leader as the result of its one entry, not as the answer's error, and
// the entry node's routing never sees it: the ack answers 503 unavailable at once
// (a forwarded extend, whose not-leader is the answer's error, follows the leadership
// and answers 204). Here the transfer completes 300 ms after the ack was sent; the
// ack must answer 204, as the one sent through the leader itself does.
func TestAForwardedAckDuringAHandoverFollowsTheLeadership(t *testing.T) {
	t.Parallel()
	bs := startReplCluster(t, 3, false)
	const name = "r3handover"
	d, lead := replLeasedOne(t, bs, name)
	entry, target := (lead+1)%3, (lead+2)%3
	lt, err := bs[lead].lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lt.parts()[0].HandOver(ctx); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		bs[lead].repl.host.TransferLeader(lt.gid(0), raftID(bs[target].meta.ServerID()))
	}()
	start := time.Now()
	err = bs[entry].Ack(name, []AckReq{{Handle: d.Handle}})[0]
	if err != nil {
		t.Fatalf("an ack through node %s during the leader's handover answered %v after %v; want 204 once the successor leads (it holds the lease)",
			bs[entry].opts.NodeID, err, time.Since(start).Round(time.Millisecond))
	}
}
