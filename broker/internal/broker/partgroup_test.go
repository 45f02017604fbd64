package broker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/raftetcd"
)

// closingHost stands in for a raftetcd.Host whose group closes while a proposal waits:
// it takes the command into the log (submitted) or not, then answers ErrClosed.
type closingHost struct{ takes bool }

func (h closingHost) ProposeResult(_ context.Context, _ string, _ []byte, submitted ...func()) (uint64, any, error) {
	if h.takes && len(submitted) > 0 && submitted[0] != nil {
		submitted[0]()
	}
	return 0, nil, raftetcd.ErrClosed
}

func (closingHost) AppendedAgo(string, uint64) (time.Duration, bool) { return 0, false }
func (closingHost) ConfirmLeader(context.Context, string) error      { return nil }

// TestAGroupClosedAfterAProposalLeavesItsOutcomeUnknown: a replicated partition's group
// that closes (its topic deleted on this node, or the node stopping) while a proposal
// waits may still see it committed by the other replicas. It answered "not the leader",
// which a produce answered 503 unavailable (nothing stored): the client sent it again
// and both copies were delivered (the cluster chaos run, seed 5151). A group that
// closed before taking the command still answers "not the leader".
func TestAGroupClosedAfterAProposalLeavesItsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := &Broker{}
	g := &partGroup{host: closingHost{takes: true}, id: "t/0"}
	_, err := g.Propose(context.Background(), []byte("cmd"), nil)
	if !errors.Is(err, partition.ErrOutcomeUnknown) || errors.Is(err, partition.ErrNotLeader) {
		t.Fatalf("closed after the proposal: %v; want the outcome unknown, not 'not the leader'", err)
	}
	if got := b.partitionErr(nil, err, "produce"); !errors.Is(got, ErrOutcomeUnknown) {
		t.Fatalf("the broker maps it to %v; want ErrOutcomeUnknown (503 timeout)", got)
	}
	g = &partGroup{host: closingHost{takes: false}, id: "t/0"}
	if _, err := g.Propose(context.Background(), []byte("cmd"), nil); !errors.Is(err, partition.ErrNotLeader) || errors.Is(err, partition.ErrOutcomeUnknown) {
		t.Fatalf("closed before the proposal: %v; want 'not the leader'", err)
	}
}
