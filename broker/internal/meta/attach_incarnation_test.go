package meta

import (
	"errors"
	"testing"

	"github.com/hashicorp/raft"
)

// TestAttachRefusesARecreatedParent: the broker reads the parent's start offsets (its
// tail) before the attach command commits. If the parent was deleted and created again
// in between, those offsets belong to the old incarnation, and linking the new one from
// them would skip the new parent's first messages. A command that names the parent
// incarnation it read must be refused then; a command from an older version (no
// incarnation) still applies as before.
func TestAttachRefusesARecreatedParent(t *testing.T) {
	apply := func(f *fsm, index uint64, js string) applyResult {
		t.Helper()
		r, _ := f.Apply(&raft.Log{Index: index, Data: frame([]byte(js))}).(applyResult)
		return r
	}
	setup := func() *fsm {
		f := newFSM()
		apply(f, 10, `{"op":"create_topic","topic":{"name":"p","partitions":1,"retention_ms":1000000}}`)
		apply(f, 11, `{"op":"create_topic","topic":{"name":"c","partitions":1,"retention_ms":1000000}}`)
		apply(f, 12, `{"op":"delete_topic","name":"p","topic":{"incarnation":0}}`)
		apply(f, 13, `{"op":"create_topic","topic":{"name":"p","partitions":1,"retention_ms":1000000}}`)
		return f
	}
	isConflict := func(err error) bool { var c *ConflictError; return errors.As(err, &c) }
	for _, tc := range []struct{ name, js, child string }{
		{"attach", `{"op":"attach_child","name":"p","child":"c","start":[5],"parent_incarnation":10}`, "c"},
		{"create-with-parent", `{"op":"create_topic","topic":{"name":"n","partitions":1,"retention_ms":1000000,"parent":"p","parent_incarnation":10},"start":[5]}`, "n"},
	} {
		f := setup()
		r := apply(f, 14, tc.js)
		if !isConflict(r.err) {
			t.Errorf("%s with the offsets of parent incarnation 10, the parent now being 13: got %v, want a conflict", tc.name, r.err)
		}
		if ch, ok := f.topic(tc.child); ok && ch.Parent != "" {
			t.Errorf("%s: %s linked to parent incarnation %d from start %v read of incarnation 10", tc.name, tc.child, ch.ParentIncarnation, ch.FanoutStart)
		}
	}
	// The current incarnation, or none named (a command of an older version), links.
	for _, js := range []string{
		`{"op":"attach_child","name":"p","child":"c","start":[0],"parent_incarnation":13}`,
		`{"op":"attach_child","name":"p","child":"c","start":[0]}`,
	} {
		f := setup()
		if r := apply(f, 14, js); r.err != nil {
			t.Fatalf("%s: %v", js, r.err)
		}
		if ch, _ := f.topic("c"); ch.Parent != "p" || ch.ParentIncarnation != 13 {
			t.Fatalf("%s: child not linked to the live parent: %+v", js, ch)
		}
	}
}
