package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// TestWireErrorsKeepTheirKind: a partition error that crosses the node plane is
// mapped on the entry node as the same error would be locally, so a forwarded request
// answers exactly as a local one. A storage failure that could not be undone keeps
// both kinds (the client is told its write may reappear).
func TestWireErrorsKeepTheirKind(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want []error
	}{
		{fmt.Errorf("settle: %w", queue.ErrLeaseLost), []error{queue.ErrLeaseLost}},
		{queue.ErrAckedAheadFull, []error{queue.ErrAckedAheadFull}},
		{fmt.Errorf("%w: offset 7", partition.ErrCorrupt), []error{partition.ErrCorrupt}},
		{partition.ErrDiskFull, []error{partition.ErrDiskFull}},
		{fmt.Errorf("%w: write: EIO", partition.ErrStorage), []error{partition.ErrStorage}},
		{fmt.Errorf("%w: %w", partition.ErrStorage, segment.ErrNotUndone), []error{partition.ErrStorage, segment.ErrNotUndone}},
		{partition.ErrClosed, []error{partition.ErrClosed}},
		{fmt.Errorf("%w: deleted", ErrTopicNotFound), []error{ErrTopicNotFound}},
		{errors.Join(ErrUnavailable, partition.ErrClosed), []error{ErrUnavailable}},
	} {
		got := fromWireErr(toWireErr(tc.err))
		for _, w := range tc.want {
			if !errors.Is(got, w) {
				t.Errorf("%v crossed the wire as %v, which is not %v", tc.err, got, w)
			}
		}
	}
	if fromWireErr(toWireErr(nil)) != nil {
		t.Errorf("no error crossed the wire as an error")
	}
	other := fromWireErr(toWireErr(errors.New("something new")))
	if other == nil || errors.Is(other, ErrUnavailable) || errors.Is(other, queue.ErrLeaseLost) {
		t.Errorf("an unknown error crossed the wire as %v", other)
	}
	// A storage error that was undone must not read as "may reappear".
	if got := fromWireErr(toWireErr(partition.ErrStorage)); errors.Is(got, segment.ErrNotUndone) {
		t.Errorf("an undone storage error crossed the wire as %v", got)
	}
}

// TestHasData: the orphan warning looks only at directories holding a non-empty file
// (a partition directory an earlier node wrote messages into), not at missing or
// empty ones.
func TestHasData(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if hasData(filepath.Join(dir, "missing")) {
		t.Error("a missing directory has data")
	}
	if err := os.MkdirAll(filepath.Join(dir, "p", "log"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p", "log", "empty"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if hasData(filepath.Join(dir, "p")) {
		t.Error("a directory of empty files has data")
	}
	if err := os.WriteFile(filepath.Join(dir, "p", "log", "00000000000000000000.seg"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !hasData(filepath.Join(dir, "p")) {
		t.Error("a directory with a non-empty segment has no data")
	}
}
