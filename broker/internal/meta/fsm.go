// Package meta is the control plane: a hashicorp/raft state machine holding topics with
// their incarnations and settings. On a single node it is a Raft cluster of one; the
// cluster work adds peers and a transport without changing the state machine.
package meta

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"

	"github.com/hashicorp/raft"
)

// ErrTopicExists means a topic of that name exists already.
var ErrTopicExists = errors.New("meta: topic exists")

// ErrTopicNotFound means no topic of that name (and incarnation, when one was given) exists.
var ErrTopicNotFound = errors.New("meta: topic not found")

// ErrUnavailable means the control plane cannot take writes now (no leader, shutting
// down, or the write did not commit in time); the outcome may be unknown.
var ErrUnavailable = errors.New("meta: control plane unavailable")

// TopicConfig is a topic's settings.
type TopicConfig struct {
	Partitions        int32           `json:"partitions"`
	RetentionMs       int64           `json:"retention_ms"`
	VisibilityMs      int64           `json:"visibility_timeout_ms"`
	MaxInFlight       int32           `json:"max_in_flight_per_partition"`
	MaxAckedAhead     int32           `json:"max_acked_ahead_per_partition"`
	ReplicationFactor int32           `json:"replication_factor"`
	Schema            json.RawMessage `json:"schema,omitempty"`
	Parent            string          `json:"parent,omitempty"`
	FanoutDelayMs     int64           `json:"fanout_delay_ms,omitempty"`
}

// Topic is one incarnation of a topic name.
type Topic struct {
	Name string `json:"name"`
	// Incarnation is the Raft index of the command that created it: unique for the life
	// of the cluster, so a name deleted and created again gets a new one.
	Incarnation uint64 `json:"incarnation"`
	CreatedAtMs int64  `json:"created_at_ms"`
	TopicConfig
}

// Alter holds the settings a PATCH may change; nil fields stay as they are.
type Alter struct {
	RetentionMs   *int64           `json:"retention_ms,omitempty"`
	VisibilityMs  *int64           `json:"visibility_timeout_ms,omitempty"`
	MaxInFlight   *int32           `json:"max_in_flight_per_partition,omitempty"`
	MaxAckedAhead *int32           `json:"max_acked_ahead_per_partition,omitempty"`
	Schema        *json.RawMessage `json:"schema,omitempty"`
}

type command struct {
	Op    string `json:"op"`
	Topic *Topic `json:"topic,omitempty"`
	Name  string `json:"name,omitempty"`
	Alter *Alter `json:"alter,omitempty"`
}

type applyResult struct {
	topic Topic
	err   error
}

// fsm is the replicated state. Every method is safe for concurrent use.
type fsm struct {
	mu       sync.RWMutex
	topics   map[string]Topic
	onChange func()
}

func newFSM() *fsm { return &fsm{topics: make(map[string]Topic)} }

func (f *fsm) Apply(l *raft.Log) any {
	var c command
	if err := json.Unmarshal(l.Data, &c); err != nil {
		// A command this version cannot read must not be skipped silently: that would let
		// replicas diverge. Panicking stops the node with the reason.
		panic(fmt.Sprintf("meta: undecodable command at index %d: %v", l.Index, err))
	}
	res := f.apply(l.Index, c)
	if f.onChange != nil {
		f.onChange()
	}
	return res
}

func (f *fsm) apply(index uint64, c command) applyResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch c.Op {
	case "create_topic":
		if _, ok := f.topics[c.Topic.Name]; ok {
			return applyResult{err: ErrTopicExists}
		}
		t := *c.Topic
		t.Incarnation = index
		f.topics[t.Name] = t
		return applyResult{topic: t}
	case "delete_topic":
		t, ok := f.topics[c.Name]
		if !ok || (c.Topic != nil && c.Topic.Incarnation != 0 && c.Topic.Incarnation != t.Incarnation) {
			return applyResult{err: ErrTopicNotFound}
		}
		delete(f.topics, c.Name)
		return applyResult{topic: t}
	case "alter_topic":
		t, ok := f.topics[c.Name]
		if !ok {
			return applyResult{err: ErrTopicNotFound}
		}
		a := c.Alter
		if a.RetentionMs != nil {
			t.RetentionMs = *a.RetentionMs
		}
		if a.VisibilityMs != nil {
			t.VisibilityMs = *a.VisibilityMs
		}
		if a.MaxInFlight != nil {
			t.MaxInFlight = *a.MaxInFlight
		}
		if a.MaxAckedAhead != nil {
			t.MaxAckedAhead = *a.MaxAckedAhead
		}
		if a.Schema != nil {
			t.Schema = *a.Schema
			if string(t.Schema) == "null" {
				t.Schema = nil
			}
		}
		f.topics[c.Name] = t
		return applyResult{topic: t}
	default:
		panic(fmt.Sprintf("meta: unknown command %q at index %d", c.Op, index))
	}
}

func (f *fsm) topic(name string) (Topic, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	t, ok := f.topics[name]
	return t, ok
}

func (f *fsm) list() []Topic {
	f.mu.RLock()
	out := make([]Topic, 0, len(f.topics))
	for _, t := range f.topics {
		out = append(out, t)
	}
	f.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

type snapshotState struct {
	Topics []Topic `json:"topics"`
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	return &fsmSnapshot{state: snapshotState{Topics: f.list()}}, nil
}

func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var st snapshotState
	if err := json.NewDecoder(rc).Decode(&st); err != nil {
		return fmt.Errorf("meta: reading snapshot: %w", err)
	}
	m := make(map[string]Topic, len(st.Topics))
	for _, t := range st.Topics {
		m[t.Name] = t
	}
	f.mu.Lock()
	f.topics = m
	f.mu.Unlock()
	if f.onChange != nil {
		f.onChange()
	}
	return nil
}

type fsmSnapshot struct{ state snapshotState }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s.state); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}
