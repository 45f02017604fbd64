package partition

import (
	"errors"
	"fmt"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// TestErrorsKeepTheirCause checks that the partition's errors wrap the storage error
// behind them (%w on both sides), so the cause (a file system's error, say) stays
// reachable with errors.Is through every layer above, beside the partition's sentinel.
func TestErrorsKeepTheirCause(t *testing.T) {
	cause := errors.New("the file system said no")
	for _, c := range []struct {
		name     string
		err      error
		sentinel error
	}{
		{"read of a damaged record", readError(fmt.Errorf("%w: %w", segment.ErrCorrupt, cause)), ErrCorrupt},
		{"failed read", readError(cause), ErrStorage},
		{"full disk", storageErr(fmt.Errorf("%w: %w", segment.ErrNoSpace, cause)), ErrDiskFull},
		{"failed write", storageErr(cause), ErrStorage},
	} {
		if !errors.Is(c.err, c.sentinel) {
			t.Errorf("%s: %v is not %v", c.name, c.err, c.sentinel)
		}
		if !errors.Is(c.err, cause) {
			t.Errorf("%s: %v lost its cause from the chain", c.name, c.err)
		}
	}
}
