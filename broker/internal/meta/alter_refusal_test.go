package meta

import (
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// TestAlterRefusalsSayWhatToDo: each 409 of an alter says how to reach the change. A
// parent and a child with its own (equal) schema cannot change their schema one after
// the other (each alter is refused for differing from the other's): the child's own
// schema has to be removed first, which the old message did not say, nor what
// retention a parent with delay children may have.
func TestAlterRefusalsSayWhatToDo(t *testing.T) {
	f := newFSM()
	apply := func(index uint64, js string) error {
		t.Helper()
		r, _ := f.Apply(&raft.Log{Index: index, Data: frame([]byte(js))}).(applyResult)
		return r.err
	}
	for i, js := range []string{
		`{"op":"create_topic","topic":{"name":"p","partitions":1,"retention_ms":100000000,"schema":{"type":"object"}}}`,
		`{"op":"create_topic","topic":{"name":"c","partitions":1,"retention_ms":100000000,"schema":{"type":"object"},"parent":"p","parent_incarnation":10,"fanout_delay_ms":60000},"start":[0]}`,
	} {
		if err := apply(uint64(10+i), js); err != nil {
			t.Fatalf("%s: %v", js, err)
		}
	}
	for _, tc := range []struct{ js, want string }{
		{`{"op":"alter_topic","name":"p","alter":{"schema":{"type":"array"}}}`, `{"schema":{}}`},
		{`{"op":"alter_topic","name":"p","alter":{"clear_schema":true}}`, `{"schema":{}}`},
		{`{"op":"alter_topic","name":"c","alter":{"schema":{"type":"array"}}}`, `{"schema":{}}`},
		{`{"op":"alter_topic","name":"p","alter":{"retention_ms":1000}}`, "at least 3660000"},
	} {
		err := apply(20, tc.js)
		var ce *ConflictError
		if !errors.As(err, &ce) {
			t.Errorf("%s: %v, want a conflict", tc.js, err)
			continue
		}
		if !strings.Contains(ce.Msg, tc.want) {
			t.Errorf("%s: %q does not say what to do (%s)", tc.js, ce.Msg, tc.want)
		}
	}
}
