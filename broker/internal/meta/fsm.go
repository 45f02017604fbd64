// Package meta is the control plane: a hashicorp/raft state machine holding topics with
// their incarnations and settings. On a single node it is a Raft cluster of one; the
// cluster work adds peers and a transport without changing the state machine.
package meta

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

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

// ErrChildNotFound means the topic is not a child of that parent.
var ErrChildNotFound = errors.New("meta: child not found")

// ConflictError is a change the state refuses (a chain of children, a child that has a
// parent already, a schema mismatch, a retention shorter than a delay); Msg says why.
type ConflictError struct{ Msg string }

func (e *ConflictError) Error() string { return e.Msg }

func conflict(format string, args ...any) applyResult {
	return applyResult{err: &ConflictError{Msg: fmt.Sprintf(format, args...)}}
}

// Fan-out limits.
const (
	MaxChildren = 64
	// DelayRetentionMargin is how much longer than its longest delay a parent keeps
	// messages, so none ages out before its delayed copy is made.
	DelayRetentionMargin = int64(3600 * 1000)
)

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
	// ParentIncarnation, AttachID and FanoutStart describe the attachment: the parent's
	// incarnation, the Raft index of the attach (each attachment is new, so a detach and
	// re-attach starts fresh), and per parent partition the offset copying starts at
	// (the parent's tail when attached).
	ParentIncarnation uint64   `json:"parent_incarnation,omitempty"`
	AttachID          uint64   `json:"attach_id,omitempty"`
	FanoutStart       []uint64 `json:"fanout_start,omitempty"`
}

// Topic is one incarnation of a topic name.
type Topic struct {
	Name string `json:"name"`
	// Incarnation is the Raft index of the command that created it: unique for the life
	// of the cluster, so a name deleted and created again gets a new one.
	Incarnation uint64 `json:"incarnation"`
	CreatedAtMs int64  `json:"created_at_ms"`
	// OwnerID is the ID of the user who created the topic (0: none, as when security
	// was off); the owner may alter and delete it and manage its children while they
	// hold a create grant matching it.
	OwnerID uint64 `json:"owner_id,omitempty"`
	// Owner is the owner's name, as versions before user IDs stored it. It is read only
	// from their commands and snapshots, and turned into OwnerID when applied (none when
	// no user of that name exists then).
	Owner string `json:"owner,omitempty"`
	TopicConfig
	// Placement is per partition where it lives (see Placement); empty for a topic of
	// an old log until the cluster's init_cluster places it.
	Placement []Placement `json:"placement,omitempty"`
}

// Alter holds the settings a PATCH may change; nil fields stay as they are.
type Alter struct {
	RetentionMs   *int64           `json:"retention_ms,omitempty"`
	VisibilityMs  *int64           `json:"visibility_timeout_ms,omitempty"`
	MaxInFlight   *int32           `json:"max_in_flight_per_partition,omitempty"`
	MaxAckedAhead *int32           `json:"max_acked_ahead_per_partition,omitempty"`
	Schema        *json.RawMessage `json:"schema,omitempty"`
	// ClearSchema removes the schema (a JSON null cannot travel in Schema: it decodes
	// as an absent field).
	ClearSchema bool `json:"clear_schema,omitempty"`
	// Incarnation, when set, is the topic incarnation the alter was authorized on: the
	// alter is refused (ErrTopicNotFound) if the name has another by then. Zero (and
	// every command of an older version) alters whatever topic of the name exists.
	Incarnation uint64 `json:"incarnation,omitempty"`
	// ReplicationFactor, when set, is the replica count the topic's partitions should
	// have: the controller adds or removes replicas through moves until they do.
	// It never travels in alter_topic (a node of an older version would ignore it):
	// the broker sends it with the alter as alter_with_replication_factor (cluster
	// version 4), or before it as set_replication_factor.
	ReplicationFactor *int32 `json:"-"`
}

type command struct {
	Op    string   `json:"op"`
	Child string   `json:"child,omitempty"`
	Delay int64    `json:"delay,omitempty"`
	Start []uint64 `json:"start,omitempty"`
	// ParentInc, on attach_child, is the parent incarnation Start was read from: the
	// attach is refused if the parent was deleted and created again since. Zero (a
	// command of an older version) checks nothing. create_topic carries it in
	// Topic.ParentIncarnation.
	ParentInc uint64       `json:"parent_incarnation,omitempty"`
	Topic     *Topic       `json:"topic,omitempty"`
	Name      string       `json:"name,omitempty"`
	Alter     *Alter       `json:"alter,omitempty"`
	User      *auth.User   `json:"user,omitempty"`
	Grants    []auth.Grant `json:"grants,omitempty"`
	Hash      []byte       `json:"hash,omitempty"`
	// Seed marks a create_user that seeds the first admin: it applies only if no admin
	// was ever seeded, so a restart with the same flag never recreates a deleted admin.
	Seed bool `json:"seed,omitempty"`
	// Rules is the rule set the command was written under (cmdRules); a command applies
	// by its own, so a log written by an older version replays as it applied then.
	Rules int `json:"rules,omitempty"`
	// ClusterID, on init_cluster, is the cluster id made by the controller.
	ClusterID string `json:"cluster_id,omitempty"`
	// Member, on init_cluster and set_member, is a member record (set_member replaces
	// the record of Member.ID whole).
	Member *Member `json:"member,omitempty"`
	// Members, on init_cluster, are the members of the Raft configuration then.
	Members []Member `json:"members,omitempty"`
	// Status and ServerID, on set_status, are the member Name's new status and the
	// Raft server it was judged on: a status judged on a server the member no longer is
	// (its data directory was wiped and it joined again) does not apply.
	Status   MemberStatus `json:"status,omitempty"`
	ServerID string       `json:"server_id,omitempty"`
	// Remote and RemoteOp are the arguments of the remote-child commands (remotechild.go).
	Remote   *RemoteChild `json:"remote,omitempty"`
	RemoteOp *RemoteOp    `json:"remote_op,omitempty"`
	// Version, on set_cluster_version, is the cluster version the controller commits
	// (version.go).
	Version int `json:"version,omitempty"`
	// MoveOp is the argument of the move commands (moves.go).
	MoveOp *MoveOp `json:"move_op,omitempty"`
}

// cmdRules is the rule set of the commands this version writes:
//
//	1: delete_user and set_grants refuse to leave no user holding admin on "*".
//	2: create_user refuses a name equal to an existing one but for case.
//
// Rules that every version applies alike need no number: user IDs are given at apply
// (from a counter kept in the state), and an owner given by name is looked up then.
const cmdRules = 2

// ErrLastAdmin means the change would leave no user holding admin on "*".
var ErrLastAdmin = errors.New("meta: last admin")

type applyResult struct {
	topic     Topic
	user      auth.User
	clusterID string
	remote    RemoteChild
	move      Move
	index     uint64 // the Raft index it applied at (set by the Store)
	err       error
}

// fsm is the replicated state. Every method is safe for concurrent use.
type fsm struct {
	mu        sync.RWMutex
	topics    map[string]Topic
	users     map[string]auth.User
	seeded    bool
	nextUser  uint64 // the ID the next user gets; IDs are never reused
	clusterID string // "" until the controller's init_cluster applied
	members   map[string]Member
	remotes   map[uint64]RemoteChild // remote children by ID (remotechild.go)
	moves     map[uint64]Move        // moves by ID (moves.go)
	// removed are the Raft server ids of members removed from the cluster: refused
	// if they come back.
	removed map[string]bool
	// version is the committed cluster version (0: none committed, which is 1);
	// maxVersion the highest this node speaks (version.go): a command or snapshot of a
	// later version halts the state machine as an unknown command does.
	version    int
	maxVersion int
	// halted is set by the first command this version does not know (see Apply): from
	// then on nothing applies and no snapshot is taken, so the log stays for a newer
	// binary to replay.
	halted   error
	onChange func()
	// applied is the index of the last command this state machine applied. Raft's own
	// AppliedIndex moves when a batch is handed to the FSM goroutine, before Apply has
	// run, so a node that waits on it to read its own write can still miss it.
	applied atomic.Uint64
	// beforeApply, when set (tests), runs at the start of every Apply.
	beforeApply atomic.Pointer[func()]
	// self is this node's Raft server id; selfSince the index of the first state that
	// showed it a member (membersince.go), kept by this node only; onSelf is told when
	// it is first known.
	self      string
	selfSince atomic.Uint64
	onSelf    func(index uint64)
}

func newFSM() *fsm {
	return &fsm{topics: make(map[string]Topic), users: make(map[string]auth.User), members: make(map[string]Member), nextUser: 1, maxVersion: VersionMax,
		moves: make(map[uint64]Move), removed: make(map[string]bool)}
}

// newUserID hands out the next user ID. Called with f.mu held.
func (f *fsm) newUserID() uint64 {
	id := f.nextUser
	f.nextUser++
	return id
}

// ownerFromName turns an owner stored by name (by an older version) into that user's
// ID, or none when no such user exists. Called with f.mu held.
func (f *fsm) ownerFromName(t *Topic) {
	if t.Owner == "" {
		return
	}
	if t.OwnerID == 0 {
		if u, ok := f.users[t.Owner]; ok {
			t.OwnerID = u.ID
		}
	}
	t.Owner = ""
}

// A command in the Raft log is framed so damage is caught before it is applied (the
// bbolt log store keeps no checksums of its own):
//
//	magic "NMC1" | CRC-32C of the JSON, u32 big-endian | the command as JSON
var commandMagic = []byte("NMC1")

var commandCRC = crc32.MakeTable(crc32.Castagnoli)

func encodeCommand(c command) ([]byte, error) {
	js, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, 8+len(js))
	out = append(out, commandMagic...)
	out = binary.BigEndian.AppendUint32(out, crc32.Checksum(js, commandCRC))
	return append(out, js...), nil
}

func decodeCommand(data []byte) (command, error) {
	var c command
	if len(data) < 8 || !bytes.Equal(data[:4], commandMagic) {
		return c, errors.New("not a framed command")
	}
	js := data[8:]
	if crc32.Checksum(js, commandCRC) != binary.BigEndian.Uint32(data[4:8]) {
		return c, errors.New("checksum mismatch")
	}
	if err := json.Unmarshal(js, &c); err != nil {
		return c, err
	}
	return c, c.check()
}

// check refuses a command that decodes but lacks what its op needs: only a damaged or
// foreign log holds one, and applying it could, say, create a topic with no name.
func (c command) check() error {
	bad := func(why string) error { return fmt.Errorf("%s command %s", c.Op, why) }
	switch c.Op {
	case "create_topic":
		if c.Topic == nil || c.Topic.Name == "" || c.Topic.Partitions < 1 || c.Topic.Partitions > 256 {
			return bad("without a valid topic")
		}
	case "delete_topic", "detach_child":
		if c.Name == "" {
			return bad("without a name")
		}
	case "attach_child":
		if c.Name == "" || c.Child == "" {
			return bad("without parent and child")
		}
	case "alter_topic":
		if c.Name == "" || c.Alter == nil {
			return bad("without a name and changes")
		}
	case "alter_with_replication_factor":
		if c.Name == "" || c.Alter == nil || c.MoveOp == nil || c.MoveOp.RF < 1 {
			return bad("without a name, changes and a replication factor")
		}
	case "create_user":
		if c.User == nil || c.User.Name == "" {
			return bad("without a user")
		}
	case "delete_user", "set_grants", "set_password":
		if c.Name == "" {
			return bad("without a name")
		}
	case "restore_admin":
		if c.User == nil || c.User.Name == "" {
			return bad("without a user")
		}
	case "init_cluster":
		if c.ClusterID == "" {
			return bad("without a cluster id")
		}
		for _, m := range c.Members {
			if m.check() != nil {
				return bad("with a member lacking id or server id")
			}
		}
	case "set_member":
		if c.Member == nil || c.Member.check() != nil {
			return bad("without a valid member")
		}
	case "set_status":
		if c.Name == "" || !c.Status.valid() {
			return bad("without a name and a known status")
		}
	case "attach_remote", "detach_remote", "pause_remote", "reseal_remote", "move_remote_cursor", "update_remote":
		return c.checkRemote()
	case "set_cluster_version":
		if c.Version < 2 {
			return bad("without a version above 1")
		}
	case "start_move", "switch_move", "move_status", "move_progress", "set_replication_factor", "force_leader", "remove_member", "set_leader":
		return c.checkMove()
	default:
		return fmt.Errorf("%w %q", errUnknownOp, c.Op)
	}
	return nil
}

// errUnknownOp marks a well-framed command whose op this version does not know: a
// newer version wrote it (see fsm.Apply).
var errUnknownOp = errors.New("unknown command")

// ErrHalted means this node met a metadata command written by a newer version and
// stopped applying the log there; upgrading the binary resumes it.
// It is a kind of ErrUnavailable (the HTTP API answers 503).
var ErrHalted = fmt.Errorf("%w: halted at a command from a newer version", ErrUnavailable)

func (f *fsm) Apply(l *raft.Log) any {
	if hook := f.beforeApply.Load(); hook != nil {
		(*hook)()
	}
	if err := f.haltedErr(); err != nil {
		return applyResult{err: err}
	}
	c, err := decodeCommand(l.Data)
	if err == nil {
		err = f.speaks(c)
	}
	if errors.Is(err, errUnknownOp) || errors.Is(err, ErrVersionUnsupported) {
		// A newer version wrote it (during a rolling upgrade). Skipping it would let
		// this replica diverge and panicking would crash-loop the node, so the state
		// machine halts: nothing after it applies, no snapshot is taken (the log is kept
		// for a newer binary to replay), and the node reports not ready until upgraded.
		f.mu.Lock()
		f.halted = fmt.Errorf("%w: Raft log entry %d is %w; upgrade this node to the cluster's version", ErrHalted, l.Index, err)
		f.mu.Unlock()
		return applyResult{err: f.haltedErr()}
	}
	if err != nil {
		// A command this version cannot read or trust must not be skipped silently (that
		// would let replicas diverge) nor applied (a damaged one could drop topics and
		// their data). Panicking stops the node with the reason.
		panic(fmt.Sprintf("meta: refusing the Raft log entry at index %d: %v; the metadata store (meta/) is damaged or from another version: restore it from a backup", l.Index, err))
	}
	res := f.apply(l.Index, c)
	f.applied.Store(l.Index)
	f.noteSelf(l.Index)
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
		f.ownerFromName(&t)
		if t.Parent != "" {
			// Create and attach in one command: the topic exists linked, or not at all.
			parent, parentInc := t.Parent, t.ParentIncarnation
			t.Parent, t.ParentIncarnation = "", 0
			if r := f.checkAttach(parent, parentInc, t, t.FanoutDelayMs, c.Start); r.err != nil {
				return r
			}
			t = f.linked(parent, t, t.FanoutDelayMs, c.Start, index)
		}
		t.Placement = f.place(t.Partitions, t.ReplicationFactor)
		if len(t.Placement) > 0 {
			t.ReplicationFactor = int32(len(t.Placement[0].Replicas))
		}
		f.topics[t.Name] = t
		return applyResult{topic: t}
	case "delete_topic":
		t, ok := f.topics[c.Name]
		if !ok || (c.Topic != nil && c.Topic.Incarnation != 0 && c.Topic.Incarnation != t.Incarnation) {
			return applyResult{err: ErrTopicNotFound}
		}
		delete(f.topics, c.Name)
		f.dropRemoteChildren(c.Name)
		f.failMovesOf(t.Name, t.Incarnation)
		// Deleting a parent detaches its children.
		for name, ch := range f.topics {
			if ch.Parent == t.Name {
				f.topics[name] = unlinked(ch)
			}
		}
		return applyResult{topic: t}
	case "attach_child":
		child, ok := f.topics[c.Child]
		if !ok {
			return applyResult{err: ErrTopicNotFound}
		}
		if r := f.checkAttach(c.Name, c.ParentInc, child, c.Delay, c.Start); r.err != nil {
			return r
		}
		child = f.linked(c.Name, child, c.Delay, c.Start, index)
		f.topics[child.Name] = child
		return applyResult{topic: child}
	case "detach_child":
		if _, ok := f.topics[c.Name]; !ok {
			return applyResult{err: ErrTopicNotFound}
		}
		child, ok := f.topics[c.Child]
		if !ok || child.Parent != c.Name {
			return applyResult{err: ErrChildNotFound}
		}
		child = unlinked(child)
		f.topics[child.Name] = child
		return applyResult{topic: child}
	case "alter_topic":
		t, err := f.altered(c.Name, *c.Alter)
		if err != nil {
			return applyResult{err: err}
		}
		f.topics[c.Name] = t
		return applyResult{topic: t}
	case "alter_with_replication_factor":
		// The settings and the replica count in one command: refused whole, or
		// applied whole (as two commands, a conflict that arose between them, or a
		// change of controller, left the factor changed and the settings not).
		cur, ok := f.topics[c.Name]
		if !ok || (c.Alter.Incarnation != 0 && c.Alter.Incarnation != cur.Incarnation) {
			return applyResult{err: ErrTopicNotFound}
		}
		if rf := c.MoveOp.RF; rf != cur.ReplicationFactor && int(rf) > f.eligibleCount() {
			return conflict("replication_factor %d is more than the %d nodes that can hold a replica; add nodes first", rf, f.eligibleCount())
		}
		t, err := f.altered(c.Name, *c.Alter)
		if err != nil {
			return applyResult{err: err}
		}
		t.ReplicationFactor = c.MoveOp.RF
		f.topics[c.Name] = t
		return applyResult{topic: t}
	case "create_user":
		if c.Seed && f.seeded {
			return applyResult{err: ErrUserExists}
		}
		if _, ok := f.users[c.User.Name]; ok {
			return applyResult{err: ErrUserExists}
		}
		if c.Rules >= 2 && f.nameTaken(c.User.Name) {
			return applyResult{err: ErrUserExists}
		}
		u := *c.User
		u.ID = f.newUserID()
		f.users[u.Name] = u
		if c.Seed {
			f.seeded = true
		}
		return applyResult{user: u}
	case "delete_user":
		u, ok := f.users[c.Name]
		if !ok {
			return applyResult{err: ErrUserNotFound}
		}
		if c.Rules >= 1 && u.IsAdmin() && f.adminCount() == 1 {
			return applyResult{err: ErrLastAdmin}
		}
		delete(f.users, c.Name)
		return applyResult{user: u}
	case "set_grants":
		u, ok := f.users[c.Name]
		if !ok {
			return applyResult{err: ErrUserNotFound}
		}
		was := u.IsAdmin()
		u.Grants = c.Grants
		if c.Rules >= 1 && was && !u.IsAdmin() && f.adminCount() == 1 {
			return applyResult{err: ErrLastAdmin}
		}
		f.users[c.Name] = u
		return applyResult{user: u}
	case "restore_admin":
		// Break-glass: only while no user holds admin on *, the user of that name (or
		// the first whose name equals it but for case) gets the hash and admin on *, or
		// is created with them.
		if f.adminCount() > 0 {
			return applyResult{err: ErrUserExists}
		}
		u, ok := f.users[c.User.Name]
		if !ok {
			for _, x := range f.sortedUsers() {
				if strings.EqualFold(x.Name, c.User.Name) {
					u, ok = x, true
					break
				}
			}
		}
		if !ok {
			u = auth.User{Name: c.User.Name, ID: f.newUserID()}
		}
		u.Hash = c.User.Hash
		u.Grants = []auth.Grant{{Action: auth.Admin, Topics: []string{"*"}}}
		f.users[u.Name] = u
		return applyResult{user: u}
	case "set_password":
		u, ok := f.users[c.Name]
		if !ok {
			return applyResult{err: ErrUserNotFound}
		}
		u.Hash = c.Hash
		f.users[c.Name] = u
		return applyResult{user: u}
	case "init_cluster", "set_member", "set_status":
		return f.applyCluster(c)
	case "attach_remote", "detach_remote", "pause_remote", "reseal_remote", "move_remote_cursor", "update_remote":
		return f.applyRemote(index, c)
	case "start_move", "switch_move", "move_status", "move_progress", "set_replication_factor", "force_leader", "remove_member", "set_leader":
		return f.applyMove(index, c)
	case "set_cluster_version":
		// Never lowered: a second commit of an older decision changes nothing.
		f.version = max(f.version, c.Version)
		return applyResult{}
	default:
		panic(fmt.Sprintf("meta: unknown command %q at index %d", c.Op, index))
	}
}

// checkAttach applies the fan-out rules to linking child under parent. parentInc, when
// not zero, is the parent incarnation start was read from.
func (f *fsm) checkAttach(parentName string, parentInc uint64, child Topic, delay int64, start []uint64) applyResult {
	parent, ok := f.topics[parentName]
	if !ok {
		return applyResult{err: ErrTopicNotFound}
	}
	switch {
	case parentInc != 0 && parentInc != parent.Incarnation:
		// The start offsets are the old incarnation's tail: the new one's first messages
		// would never be copied.
		return conflict("topic %s was deleted and created again while the attach ran; attach again", parentName)
	case parentName == child.Name:
		return conflict("a topic cannot be its own child")
	case child.Parent != "":
		return conflict("topic %s is already a child of %s; detach it first", child.Name, child.Parent)
	case parent.Parent != "":
		return conflict("topic %s is itself a child of %s; children cannot have children (no chains)", parentName, parent.Parent)
	case f.hasChildren(child.Name):
		return conflict("topic %s has children of its own; children cannot have children (no chains)", child.Name)
	case f.childCount(parentName) >= MaxChildren:
		return conflict("topic %s has %d children, the most allowed", parentName, MaxChildren)
	case len(child.Schema) > 0 && len(parent.Schema) > 0 && !sameJSON(child.Schema, parent.Schema):
		return conflict("child %s has a schema different from its parent's; give it the same schema or none (it then inherits the parent's)", child.Name)
	case len(child.Schema) > 0 && len(parent.Schema) == 0:
		return conflict("child %s has a schema but parent %s has none; a child's schema must equal its parent's", child.Name, parentName)
	case delay > 0 && parent.RetentionMs < delay+DelayRetentionMargin:
		return conflict("parent %s keeps messages %d ms, less than the delay %d ms plus an hour; raise its retention_ms first", parentName, parent.RetentionMs, delay)
	case len(start) != int(parent.Partitions):
		return conflict("attach start offsets do not match parent %s's partitions", parentName)
	}
	return applyResult{}
}

func (f *fsm) linked(parentName string, child Topic, delay int64, start []uint64, index uint64) Topic {
	parent := f.topics[parentName]
	child.Parent = parentName
	child.ParentIncarnation = parent.Incarnation
	child.FanoutDelayMs = delay
	child.AttachID = index
	child.FanoutStart = append([]uint64(nil), start...)
	return child
}

func unlinked(t Topic) Topic {
	t.Parent, t.ParentIncarnation, t.FanoutDelayMs, t.AttachID, t.FanoutStart = "", 0, 0, 0, nil
	return t
}

func (f *fsm) hasChildren(name string) bool { return f.childCount(name) > 0 }

func (f *fsm) childCount(name string) int {
	n := 0
	for _, t := range f.topics {
		if t.Parent == name {
			n++
		}
	}
	return n
}

func (f *fsm) longestDelay(name string) int64 {
	var d int64
	for _, t := range f.topics {
		if t.Parent == name && t.FanoutDelayMs > d {
			d = t.FanoutDelayMs
		}
	}
	return d
}

// sameJSON reports whether two JSON documents are equal as values.
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}

// altered returns topic name with the changes of a, or why the changes are refused;
// it changes nothing (alter_topic stores what it returns, CheckAlter only asks). The
// caller holds f.mu.
func (f *fsm) altered(name string, a Alter) (Topic, error) {
	t, ok := f.topics[name]
	if !ok || (a.Incarnation != 0 && a.Incarnation != t.Incarnation) {
		return Topic{}, ErrTopicNotFound
	}
	if a.RetentionMs != nil {
		if need := f.longestDelay(t.Name) + DelayRetentionMargin; f.longestDelay(t.Name) > 0 && *a.RetentionMs < need {
			return Topic{}, &ConflictError{Msg: fmt.Sprintf("retention_ms %d is shorter than this topic's longest child delay plus an hour: its messages would age out before their delayed copies; give it at least %d, or detach that child first", *a.RetentionMs, need)}
		}
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
	if a.ClearSchema {
		empty := json.RawMessage(nil)
		a.Schema = &empty
	}
	if a.Schema != nil {
		ns := *a.Schema
		if string(ns) == "null" {
			ns = nil
		}
		if p, ok := f.topics[t.Parent]; ok && len(ns) > 0 && !sameJSON(ns, p.Schema) {
			return Topic{}, &ConflictError{Msg: fmt.Sprintf("child %s must have its parent's schema or none: leave it without one (PATCH it with {\"schema\":{}}; it then checks against parent %s's), or change the parent's schema", t.Name, t.Parent)}
		}
		for _, ch := range f.topics {
			if ch.Parent == t.Name && len(ch.Schema) > 0 && !sameJSON(ch.Schema, ns) {
				return Topic{}, &ConflictError{Msg: fmt.Sprintf("child %s has its own schema, and a parent's schema must stay equal to its children's: remove the child's first (PATCH it with {\"schema\":{}}; it then checks against this topic's), change this one, then give the child the same again if it should keep its own", ch.Name)}
			}
		}
		t.Schema = ns
	}
	return t, nil
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

// userByID finds a user by the ID that is never reused (false when none has it).
func (f *fsm) userByID(id uint64) (auth.User, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, u := range f.users {
		if u.ID == id {
			return u, true
		}
	}
	return auth.User{}, false
}

func (f *fsm) userList() []auth.User {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.sortedUsers()
}

// sortedUsers lists the users by name. Called with f.mu held.
func (f *fsm) sortedUsers() []auth.User {
	out := make([]auth.User, 0, len(f.users))
	for _, u := range f.users {
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// nameTaken reports whether a user's name equals name but for case. Called with f.mu
// held.
func (f *fsm) nameTaken(name string) bool {
	for n := range f.users {
		if strings.EqualFold(n, name) {
			return true
		}
	}
	return false
}

// adminCount counts the users holding admin on "*". Called with f.mu held.
func (f *fsm) adminCount() int {
	n := 0
	for _, u := range f.users {
		if u.IsAdmin() {
			n++
		}
	}
	return n
}

// leavesNoAdmin reports whether deleting user name (grants nil) or giving them grants
// would leave no user holding admin on "*".
func (f *fsm) leavesNoAdmin(name string, grants []auth.Grant) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	u, ok := f.users[name]
	if !ok || !u.IsAdmin() || f.adminCount() != 1 {
		return false
	}
	return grants == nil || !(&auth.User{Grants: grants}).IsAdmin()
}

func (f *fsm) hasAdmin() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.adminCount() > 0
}

type snapshotState struct {
	Topics    []Topic     `json:"topics"`
	Users     []auth.User `json:"users,omitempty"`
	Seeded    bool        `json:"seeded,omitempty"`
	NextUser  uint64      `json:"next_user_id,omitempty"`
	ClusterID string      `json:"cluster_id,omitempty"`
	Members   []Member    `json:"members,omitempty"`
	// RemoteChildren hold their passwords sealed (see RemoteChild.Sealed).
	RemoteChildren []RemoteChild `json:"remote_children,omitempty"`
	// Applied is the index of the last command the state holds (0 in snapshots from
	// before it was kept).
	Applied uint64 `json:"applied_index,omitempty"`
	// ClusterVersion is the committed cluster version (absent: 1). A binary from
	// before cluster versions never gets a snapshot holding one: the version is
	// committed only once every member speaks it.
	ClusterVersion int `json:"cluster_version,omitempty"`
	// Moves and Removed are the moves (moves.go) and the Raft server ids of removed
	// members (cluster version 3).
	Moves   []Move   `json:"moves,omitempty"`
	Removed []string `json:"removed,omitempty"`
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	if err := f.haltedErr(); err != nil {
		// A snapshot would let Raft drop the entries a newer binary must replay.
		return nil, err
	}
	st := snapshotState{Topics: f.list(), Users: f.userList(), Members: f.memberList(), RemoteChildren: f.remoteList(), Moves: f.moveList()}
	f.mu.RLock()
	for sid := range f.removed {
		st.Removed = append(st.Removed, sid)
	}
	sort.Strings(st.Removed)
	st.Seeded, st.NextUser, st.ClusterID, st.ClusterVersion = f.seeded, f.nextUser, f.clusterID, f.version
	f.mu.RUnlock()
	st.Applied = f.applied.Load()
	return &fsmSnapshot{state: st}, nil
}

func (f *fsm) Restore(rc io.ReadCloser) error {
	defer func() { _ = rc.Close() }() // read-only snapshot; a decode error is returned
	var st snapshotState
	if err := json.NewDecoder(rc).Decode(&st); err != nil {
		return fmt.Errorf("meta: reading snapshot: %w", err)
	}
	// A snapshot from before user IDs has users without one and owners by name: the
	// users get IDs past any in it, in name order (the same on every replica), and each
	// owner name becomes that user's ID, or none when the user is gone.
	next := max(st.NextUser, 1)
	for _, u := range st.Users {
		next = max(next, u.ID+1)
	}
	sort.Slice(st.Users, func(i, j int) bool { return st.Users[i].Name < st.Users[j].Name })
	us := make(map[string]auth.User, len(st.Users))
	for _, u := range st.Users {
		if u.ID == 0 {
			u.ID = next
			next++
		}
		us[u.Name] = u
	}
	m := make(map[string]Topic, len(st.Topics))
	ms := make(map[string]Member, len(st.Members))
	for _, mb := range st.Members {
		ms[mb.ID] = mb
	}
	f.mu.Lock()
	f.topics, f.users, f.seeded, f.nextUser = m, us, st.Seeded, next
	f.clusterID, f.members, f.version = st.ClusterID, ms, st.ClusterVersion
	if st.ClusterVersion > f.maxVersion {
		// The snapshot holds the state of a cluster version this node cannot speak: it
		// is kept (a newer binary resumes from it), and nothing applies until then.
		f.halted = fmt.Errorf("%w: %w: the snapshot at index %d holds cluster version %d, this node speaks %v; upgrade this node to the cluster's version",
			ErrHalted, ErrVersionUnsupported, st.Applied, st.ClusterVersion, versionRange{VersionMin, f.maxVersion})
	}
	f.moves = make(map[uint64]Move, len(st.Moves))
	for _, mv := range st.Moves {
		f.moves[mv.ID] = mv
	}
	f.removed = make(map[string]bool, len(st.Removed))
	for _, sid := range st.Removed {
		f.removed[sid] = true
	}
	f.remotes = make(map[uint64]RemoteChild, len(st.RemoteChildren))
	for _, r := range st.RemoteChildren {
		f.remotes[r.ID] = r
	}
	for _, t := range st.Topics {
		f.ownerFromName(&t)
		m[t.Name] = t
	}
	f.mu.Unlock()
	f.applied.Store(st.Applied)
	f.noteSelf(st.Applied) // a snapshot from before it kept its index: the next Apply notes it
	if f.onChange != nil {
		f.onChange()
	}
	return nil
}

type fsmSnapshot struct{ state snapshotState }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s.state); err != nil {
		_ = sink.Cancel() // the encode error is the one to report; raft discards the snapshot
		return err
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}

// ErrMemberNotFound means no member of that node id (and Raft server id, when one was
// given) exists.
var ErrMemberNotFound = errors.New("meta: member not found")

var errBadMember = errors.New("member without id, server id or a known status")
