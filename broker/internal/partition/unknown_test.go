package partition

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// unknownGroup takes every command into its log and then cannot tell whether it
// committed (its group closed under it, as a deleted topic's does).
type unknownGroup struct{}

func (unknownGroup) Propose(_ context.Context, _ []byte, submitted func()) (any, error) {
	if submitted != nil {
		submitted()
	}
	return nil, fmt.Errorf("%w: the group closed after the write was proposed", ErrOutcomeUnknown)
}

func (unknownGroup) Confirm(context.Context) error { return nil }

// TestAnUnknownOutcomeIsNotNotLeader: a proposal whose outcome the group cannot tell
// reaches the partition's caller as unknown only. It was also "not the leader", on
// which a caller may send the write to the leader again: a second copy.
func TestAnUnknownOutcomeIsNotNotLeader(t *testing.T) {
	p := mustOpen(t, vfs.NewMem(), func(o *Options) { o.Group = unknownGroup{} })
	defer p.Close()
	p.SetRole(true, 1)
	_, err := p.Append([]segment.Record{{Value: []byte("v")}})
	if !errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrNotLeader) {
		t.Fatalf("append: %v; want the outcome unknown and not 'not the leader'", err)
	}
}
