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

	"github.com/narad-mq/narad/broker/internal/auth"
)

// ErrTopicExists means a topic of that name exists already.
var ErrTopicExists = errors.New("meta: topic exists")

// ErrTopicNotFound means no topic of that name (and incarnation, when one was given) exists.
var ErrTopicNotFound = errors.New("meta: topic not found")

// ErrUserExists means a user of that name exists already.
var ErrUserExists = errors.New("meta: user exists")

// ErrUserNotFound means no user of that name exists.
var ErrUserNotFound = errors.New("meta: user not found")

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
	// Owner is the user who created the topic ("" when security was off); the owner may
	// alter and delete it and manage its children.
	Owner string `json:"owner,omitempty"`
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
	Op     string       `json:"op"`
	Topic  *Topic       `json:"topic,omitempty"`
	Name   string       `json:"name,omitempty"`
	Alter  *Alter       `json:"alter,omitempty"`
	User   *auth.User   `json:"user,omitempty"`
	Grants []auth.Grant `json:"grants,omitempty"`
	Hash   []byte       `json:"hash,omitempty"`
	// Seed marks a create_user that seeds the first admin: it applies only if no admin
	// was ever seeded, so a restart with the same flag never recreates a deleted admin.
	Seed bool `json:"seed,omitempty"`
}

type applyResult struct {
	topic Topic
	user  auth.User
	err   error
}

// fsm is the replicated state. Every method is safe for concurrent use.
type fsm struct {
	mu       sync.RWMutex
	topics   map[string]Topic
	users    map[string]auth.User
	seeded   bool
	onChange func()
}

func newFSM() *fsm { return &fsm{topics: make(map[string]Topic), users: make(map[string]auth.User)} }

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
	case "create_user":
		if c.Seed && f.seeded {
			return applyResult{err: ErrUserExists}
		}
		if _, ok := f.users[c.User.Name]; ok {
			return applyResult{err: ErrUserExists}
		}
		f.users[c.User.Name] = *c.User
		if c.Seed {
			f.seeded = true
		}
		return applyResult{user: *c.User}
	case "delete_user":
		u, ok := f.users[c.Name]
		if !ok {
			return applyResult{err: ErrUserNotFound}
		}
		delete(f.users, c.Name)
		return applyResult{user: u}
	case "set_grants":
		u, ok := f.users[c.Name]
		if !ok {
			return applyResult{err: ErrUserNotFound}
		}
		u.Grants = c.Grants
		f.users[c.Name] = u
		return applyResult{user: u}
	case "set_password":
		u, ok := f.users[c.Name]
		if !ok {
			return applyResult{err: ErrUserNotFound}
		}
		u.Hash = c.Hash
		f.users[c.Name] = u
		return applyResult{user: u}
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

func (f *fsm) user(name string) (auth.User, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	u, ok := f.users[name]
	return u, ok
}

func (f *fsm) userList() []auth.User {
	f.mu.RLock()
	out := make([]auth.User, 0, len(f.users))
	for _, u := range f.users {
		out = append(out, u)
	}
	f.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

type snapshotState struct {
	Topics []Topic     `json:"topics"`
	Users  []auth.User `json:"users,omitempty"`
	Seeded bool        `json:"seeded,omitempty"`
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	st := snapshotState{Topics: f.list(), Users: f.userList()}
	f.mu.RLock()
	st.Seeded = f.seeded
	f.mu.RUnlock()
	return &fsmSnapshot{state: st}, nil
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
	us := make(map[string]auth.User, len(st.Users))
	for _, u := range st.Users {
		us[u.Name] = u
	}
	f.mu.Lock()
	f.topics, f.users, f.seeded = m, us, st.Seeded
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
