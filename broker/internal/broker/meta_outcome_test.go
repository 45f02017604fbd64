package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/narad-mq/narad/broker/internal/meta"
)

// TestMetadataWriteOfUnknownOutcomeIsATimeout: a metadata write Raft gave no answer to
// in time may have happened, so it is not passed on as "unavailable" (which the HTTP
// API answers as safe to retry) but as a timeout (503 timeout: outcome unknown); a
// write refused before it was proposed stays unavailable.
func TestMetadataWriteOfUnknownOutcomeIsATimeout(t *testing.T) {
	t.Parallel()
	unknown := mapMetaErr(fmt.Errorf("%w: create_topic", meta.ErrOutcomeUnknown))
	if !errors.Is(unknown, context.DeadlineExceeded) || errors.Is(unknown, ErrUnavailable) {
		t.Errorf("outcome unknown mapped to %v: want a deadline exceeded that is not ErrUnavailable", unknown)
	}
	refused := mapMetaErr(fmt.Errorf("%w: no controller", meta.ErrUnavailable))
	if !errors.Is(refused, ErrUnavailable) || errors.Is(refused, context.DeadlineExceeded) {
		t.Errorf("unavailable mapped to %v: want ErrUnavailable", refused)
	}
}
