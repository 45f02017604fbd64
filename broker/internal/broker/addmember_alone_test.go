package broker

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestAddMemberOnALoneNodeSaysWhatToDo: a node started without a cluster address
// admits no members (501). Its answer joined two errors, a newline and the control
// plane's internal wording ("meta: no forwarder configured") into the message.
func TestAddMemberOnALoneNodeSaysWhatToDo(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	err := b.AddMember(context.Background(), "n2", "127.0.0.1:1")
	if !errors.Is(err, ErrNotImplemented) {
		t.Fatalf("AddMember on a lone node: %v, want ErrNotImplemented", err)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || strings.Contains(msg, "forwarder") || !strings.Contains(msg, "--cluster-addr") {
		t.Fatalf("the 501's message %q should be one line naming what to start the nodes with", msg)
	}
}
