package meta

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// frame wraps a command's JSON as the store writes it to the Raft log.
func frame(js []byte) []byte {
	out := append([]byte(nil), commandMagic...)
	out = binary.BigEndian.AppendUint32(out, crc32.Checksum(js, commandCRC))
	return append(out, js...)
}

// FuzzApplyCommands decodes one Raft command per input line and applies them in order,
// as the FSM does on a replica. A line that does not decode, or names an unknown op,
// must stop the node with a "meta:" panic (never be skipped); a well-formed command
// must apply without panicking; after every step the state must keep the fan-out rules
// (no chains, no self-parent, at most MaxChildren children, every child's parent
// exists) and survive a snapshot and restore unchanged.
func FuzzApplyCommands(f *testing.F) {
	seeds := []string{
		`{"op":"create_topic","topic":{"name":"a","partitions":2,"retention_ms":7200000}}
{"op":"create_topic","topic":{"name":"b","partitions":1,"parent":"a","fanout_delay_ms":5},"start":[0,0]}
{"op":"alter_topic","name":"a","alter":{"retention_ms":1000}}
{"op":"delete_topic","name":"a"}`,
		`{"op":"create_topic","topic":{"name":"a","partitions":1}}
{"op":"create_topic","topic":{"name":"b","partitions":1}}
{"op":"attach_child","name":"a","child":"b","start":[3]}
{"op":"attach_child","name":"b","child":"a","start":[0]}
{"op":"detach_child","name":"a","child":"b"}`,
		`{"op":"create_user","user":{"name":"u"},"seed":true}
{"op":"set_grants","name":"u","grants":[{"action":"produce","topics":["x.*"]}]}
{"op":"set_password","name":"u","hash":"AAEC"}
{"op":"delete_user","name":"u"}
{"op":"create_user","user":{"name":"u"},"seed":true}`,
		`{"op":"create_user","user":{"name":"a","grants":[{"action":"admin","topics":["*"]}]},"seed":true}
{"op":"delete_user","name":"a","rules":1}
{"op":"set_grants","name":"a","grants":[],"rules":1}
{"op":"delete_user","name":"a"}
{"op":"restore_admin","user":{"name":"a","hash":"AAEC"},"rules":1}
{"op":"restore_admin","user":{"name":"b"},"rules":1}`,
		`{"op":"create_user","user":{"name":"o","id":77}}
{"op":"create_topic","topic":{"name":"t","partitions":1,"owner":"o"}}
{"op":"create_topic","topic":{"name":"u","partitions":1,"owner":"x","owner_id":3}}
{"op":"delete_user","name":"o","rules":1}
{"op":"create_user","user":{"name":"o"}}`,
		`{"op":"alter_topic","name":"nope","alter":{"schema":{"type":"object"}}}`,
		`{"op":"bogus"}`,
		`not json`,
		`{"op":"create_topic","topic":{"name":"a","schema":{"type":"object"}}}
{"op":"create_topic","topic":{"name":"c","schema":{"type":"string"}}}
{"op":"attach_child","name":"a","child":"c","start":[]}
{"op":"alter_topic","name":"a","alter":{"clear_schema":true}}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fsm := newFSM()
		for i, line := range bytes.Split(data, []byte("\n")) {
			var c command
			valid := json.Unmarshal(line, &c) == nil && c.check() == nil
			unknown := json.Unmarshal(line, &c) == nil && errors.Is(c.check(), errUnknownOp)
			panicked := applyRecover(fsm, uint64(i+1), frame(line))
			switch {
			case unknown && panicked != "":
				t.Fatalf("line %d %q: a command from a newer version panicked: %s", i+1, line, panicked)
			case unknown:
				// The state machine halts there: nothing after it applies.
				if fsm.haltedErr() == nil {
					t.Fatalf("line %d %q: an unknown command did not halt the state machine", i+1, line)
				}
				return
			case !valid && !strings.HasPrefix(panicked, "meta: "):
				t.Fatalf("line %d %q: want a meta: panic for a command this version cannot apply, got %q", i+1, line, panicked)
			case valid && panicked != "":
				t.Fatalf("line %d %q: a well-formed command panicked: %s", i+1, line, panicked)
			case panicked != "":
				return // the node would stop here
			}
			// The same bytes unframed, or with one bit flipped, are refused, never applied.
			if msg := applyRecover(newFSM(), 1, line); !strings.HasPrefix(msg, "meta: ") {
				t.Fatalf("an unframed command was not refused: %q", msg)
			}
			if len(line) > 0 {
				bad := frame(line)
				bad[8+len(line)/2] ^= 0x10
				if msg := applyRecover(newFSM(), 1, bad); !strings.HasPrefix(msg, "meta: ") {
					t.Fatalf("a command with a flipped bit was not refused: %q", msg)
				}
			}
			checkFSM(t, fsm)
		}
	})
}

func applyRecover(f *fsm, index uint64, data []byte) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	f.Apply(&raft.Log{Index: index, Data: data})
	return ""
}

func checkFSM(t *testing.T, f *fsm) {
	t.Helper()
	f.mu.RLock()
	children := map[string]int{}
	for name, tp := range f.topics {
		if tp.Name != name {
			t.Fatalf("topic stored under %q is named %q", name, tp.Name)
		}
		if tp.Parent == "" {
			continue
		}
		p, ok := f.topics[tp.Parent]
		switch {
		case tp.Parent == name:
			t.Fatalf("%s is its own parent", name)
		case !ok:
			t.Fatalf("%s's parent %s does not exist", name, tp.Parent)
		case p.Parent != "":
			t.Fatalf("chain: %s → %s → %s", name, tp.Parent, p.Parent)
		case p.Incarnation != tp.ParentIncarnation:
			t.Fatalf("%s's parent incarnation %d, the parent is %d", name, tp.ParentIncarnation, p.Incarnation)
		}
		children[tp.Parent]++
	}
	f.mu.RUnlock()
	for p, n := range children {
		if n > MaxChildren {
			t.Fatalf("%s has %d children", p, n)
		}
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := newFSM()
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil {
		t.Fatalf("restoring a snapshot: %v", err)
	}
	if !reflect.DeepEqual(normal(f.list()), normal(g.list())) || !reflect.DeepEqual(f.userList(), g.userList()) {
		t.Fatalf("a snapshot and restore changed the state:\n%+v\n%+v", f.list(), g.list())
	}
}

// normal makes raw JSON comparable after a round trip through encoding/json (which
// may escape it differently: "&" becomes "\u0026").
func normal(ts []Topic) []Topic {
	for i := range ts {
		if len(ts[i].Schema) > 0 {
			var v any
			if json.Unmarshal(ts[i].Schema, &v) == nil {
				ts[i].Schema, _ = json.Marshal(v)
			}
		}
	}
	return ts
}

type memSink struct{ buf bytes.Buffer }

func (s *memSink) Write(p []byte) (int, error) { return s.buf.Write(p) }
func (s *memSink) Close() error                { return nil }
func (s *memSink) ID() string                  { return "mem" }
func (s *memSink) Cancel() error               { return nil }
