package meta

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
)

// TestPersistRacingLaterCommands: hashicorp/raft takes a snapshot on the state-machine
// goroutine and persists it on another while later commands apply. For the snapshot of
// every step of the command history (every op, every replicated field), the rest of
// the history applies while Persist encodes it: under -race any slice, map or pointer
// the snapshot shares with the live state and a later command writes is reported, and
// the snapshot restores to the state at its own index.
func TestPersistRacingLaterCommands(t *testing.T) {
	cmds, _ := history(t)
	for k := range cmds {
		f := newFSM()
		for i, c := range cmds[:k+1] {
			applyAt(t, f, uint64(i+1), c)
		}
		want, err := json.Marshal(stateOf(f))
		if err != nil {
			t.Fatal(err)
		}
		snap, err := f.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		sink := &memSink{}
		persisted := make(chan error, 1)
		go func() { persisted <- snap.Persist(sink) }()
		for i, c := range cmds[k+1:] {
			applyAt(t, f, uint64(k+2+i), c)
		}
		if err := <-persisted; err != nil {
			t.Fatal(err)
		}
		g := newFSM()
		if err := g.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil {
			t.Fatal(err)
		}
		if got, _ := json.Marshal(stateOf(g)); !bytes.Equal(want, got) {
			t.Fatalf("the snapshot of step %d %s, persisted while the rest applied, differs:\nwant %s\ngot  %s", k+1, cmds[k].Op, want, got)
		}
	}
}
