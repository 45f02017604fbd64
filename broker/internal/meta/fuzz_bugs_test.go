//go:build bugs

package meta

import (
	"strings"
	"testing"
)

// BUG (found by FuzzApplyCommands; minor): a decodable command that lacks the field its
// op needs — {"op":"create_topic"} without "topic", alter_topic without "alter",
// create_user without "user" — panics with a nil pointer dereference in fsm.apply
// (fsm.go: `t := *c.Topic`, `a.RetentionMs`, `*c.User`) instead of the "meta:" panic
// that names the command and index, as Apply does for an undecodable one. The store
// never writes such a command, so only a damaged or foreign Raft log entry shows it; the
// node stops either way, with a worse message. Run: go test -tags bugs -run TestBug ./internal/meta/
func TestBugApplyNilFields(t *testing.T) {
	for _, cmd := range []string{`{"op":"create_topic"}`, `{"op":"alter_topic","name":"a"}`, `{"op":"create_user"}`} {
		f := newFSM()
		applyRecover(f, 1, []byte(`{"op":"create_topic","topic":{"name":"a","partitions":1}}`))
		msg := applyRecover(f, 2, []byte(cmd))
		t.Logf("%s: panic %q", cmd, msg)
		if !strings.HasPrefix(msg, "meta: ") {
			t.Errorf("%s: panic %q, want a meta: panic naming the command", cmd, msg)
		}
	}
}
