package httpapi

import (
	"errors"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/broker"
)

// TestStorageErrorSaysWhetherAnythingMayBeStored: a 503 storage_failed claims nothing
// was stored only when the failed write was undone.
func TestStorageErrorSaysWhetherAnythingMayBeStored(t *testing.T) {
	undone := toAPIError(errors.Join(broker.ErrStorage, errors.New("eio")))
	notUndone := toAPIError(errors.Join(broker.ErrStorage, broker.ErrMaybeStored, errors.New("eio")))
	if undone.status != 503 || notUndone.status != 503 || undone.code != "storage_failed" || notUndone.code != "storage_failed" {
		t.Fatalf("got %d %s and %d %s, want 503 storage_failed for both", undone.status, undone.code, notUndone.status, notUndone.code)
	}
	if !strings.Contains(undone.msg, "not stored") {
		t.Errorf("undone write: message %q should say it was not stored", undone.msg)
	}
	if strings.Contains(notUndone.msg, "not stored") || !strings.Contains(notUndone.msg, "may be found stored") {
		t.Errorf("write not undone: message %q must not claim nothing was stored", notUndone.msg)
	}
}
