package meta

import (
	"errors"
	"testing"

	"github.com/hashicorp/raft"
)

// TestAlterAndDeleteOfAnIncarnation: an alter or delete naming the incarnation it was
// authorized on is refused with ErrTopicNotFound when the name has another by then; one
// naming the live incarnation, or none (a command of an older version), applies.
func TestAlterAndDeleteOfAnIncarnation(t *testing.T) {
	apply := func(f *fsm, index uint64, js string) applyResult {
		t.Helper()
		r, _ := f.Apply(&raft.Log{Index: index, Data: frame([]byte(js))}).(applyResult)
		return r
	}
	setup := func() *fsm {
		f := newFSM()
		apply(f, 10, `{"op":"create_topic","topic":{"name":"t","partitions":1,"retention_ms":1000000}}`)
		apply(f, 11, `{"op":"delete_topic","name":"t"}`)
		apply(f, 12, `{"op":"create_topic","topic":{"name":"t","partitions":1,"retention_ms":1000000}}`)
		return f
	}
	for _, js := range []string{
		`{"op":"alter_topic","name":"t","alter":{"retention_ms":5000,"incarnation":10}}`,
		`{"op":"delete_topic","name":"t","topic":{"incarnation":10}}`,
		`{"op":"delete_topic","name":"t","topic":{"incarnation":18446744073709551615}}`,
	} {
		f := setup()
		if r := apply(f, 13, js); !errors.Is(r.err, ErrTopicNotFound) {
			t.Errorf("%s against incarnation 12: got %v, want ErrTopicNotFound", js, r.err)
		}
		if cur, ok := f.topic("t"); !ok || cur.Incarnation != 12 || cur.RetentionMs != 1000000 {
			t.Errorf("%s changed incarnation 12: %+v (present %v)", js, cur, ok)
		}
	}
	for _, js := range []string{
		`{"op":"alter_topic","name":"t","alter":{"retention_ms":5000,"incarnation":12}}`,
		`{"op":"alter_topic","name":"t","alter":{"retention_ms":5000}}`,
	} {
		f := setup()
		if r := apply(f, 13, js); r.err != nil {
			t.Fatalf("%s: %v", js, r.err)
		}
		if cur, _ := f.topic("t"); cur.RetentionMs != 5000 {
			t.Errorf("%s: retention %d, want 5000", js, cur.RetentionMs)
		}
	}
}
