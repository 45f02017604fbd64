package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/auth"
)

// Forwarder carries control-plane requests from one node to another. The node plane
// implements it (one request/response operation whose receiving side calls
// Store.HandleForward); in-process tests call the other Store directly.
//
// Requests are opaque bytes made and read by this package: metadata writes sent to the
// controller, the controller's commit index (for readiness), joins, heartbeats, and a
// node's identity (for bootstrap). addr is a cluster address (a Raft server address).
type Forwarder interface {
	Forward(ctx context.Context, addr raft.ServerAddress, req []byte) ([]byte, error)
}

// ErrNotLeader means the node asked is not the controller (or stopped being it before
// the write was proposed): nothing was written, so the write can be sent again.
var ErrNotLeader = errors.New("meta: not the controller")

// ErrNotDelivered is what a Forwarder wraps when the request certainly did not reach
// the other node (it could not connect, or the connection failed before the request was
// sent): a write is then sent again, to whichever node leads by then, within
// ApplyTimeout. Any other Forwarder error leaves the outcome unknown.
var ErrNotDelivered = errors.New("meta: request not delivered")

// ErrNoForwarder means this node would have to ask another node, but it was opened
// without a Forwarder.
var ErrNoForwarder = errors.New("meta: no forwarder configured to reach other nodes")

// Request kinds.
const (
	kindApply     = "apply"      // a metadata write, for the controller
	kindReadIndex = "read_index" // the controller's applied index after a barrier
	kindSyncIndex = "sync_index" // the controller's last entry that may carry a write, once it verified it leads (Sync)
	kindJoin      = "join"       // admit a node, for the controller
	kindAdd       = "add"        // admit the node at an address (POST /v1/cluster/members)
	kindHeartbeat = "heartbeat"  // a member is alive, for the controller
	kindIdentity  = "identity"   // who are you, and are you in a cluster yet
	kindMaxEnd    = "max_end"    // the highest log end reported of a partition group (version 3)
)

type fwdRequest struct {
	Kind string `json:"kind"`
	// Hops counts how often the request was passed on: a member that is not the
	// controller passes a request on once, never in a circle.
	Hops int           `json:"hops,omitempty"`
	Cmd  []byte        `json:"cmd,omitempty"`
	Join *joinRequest  `json:"join,omitempty"`
	Beat *joinRequest  `json:"beat,omitempty"`
	Add  *addRequest   `json:"add,omitempty"`
	Info *identityInfo `json:"info,omitempty"`
	// Group, on max_end, is the partition group asked about.
	Group string `json:"group,omitempty"`
	// Commit, on sync_index, is the commit index the asking node knows: below the
	// answer, the controller nudges (store.go). A node from before it sends none.
	Commit uint64 `json:"commit,omitempty"`
}

// joinRequest describes a node asking to be a member (and, as a heartbeat, a member
// saying it is alive).
type joinRequest struct {
	NodeID      string `json:"node_id"`
	ServerID    string `json:"server_id"`
	ClusterAddr string `json:"cluster_addr"`
	HTTPAddr    string `json:"http_addr,omitempty"`
	// MinVersion and MaxVersion are the cluster versions the node speaks (version.go).
	// A binary from before cluster versions sends neither; one that knows them ignores
	// them, so a heartbeat of either kind reaches a controller of either kind.
	MinVersion int `json:"min_version,omitempty"`
	MaxVersion int `json:"max_version,omitempty"`
	// Ends, in a heartbeat, is the log end of each replicated partition held by the
	// node (by group id): the controller keeps the highest it heard of each, the lower
	// bound a forced takeover reports as possibly lost. An older controller ignores it.
	Ends map[string]uint64 `json:"ends,omitempty"`
}

type addRequest struct {
	NodeID      string `json:"node_id"`
	ClusterAddr string `json:"cluster_addr"`
}

// identityInfo is a node's answer to an identity request.
type identityInfo struct {
	NodeID   string `json:"node_id"`
	ServerID string `json:"server_id"`
	HTTPAddr string `json:"http_addr,omitempty"`
	// Formed says the node holds a Raft configuration: it is in a cluster already.
	Formed bool `json:"formed"`
	// MinVersion and MaxVersion are the cluster versions it speaks (none from a
	// binary before cluster versions: 1 only).
	MinVersion int `json:"min_version,omitempty"`
	MaxVersion int `json:"max_version,omitempty"`
}

type fwdResponse struct {
	Topic     *Topic        `json:"topic,omitempty"`
	User      *auth.User    `json:"user,omitempty"`
	ClusterID string        `json:"cluster_id,omitempty"`
	Index     uint64        `json:"index,omitempty"`
	Info      *identityInfo `json:"info,omitempty"`
	Move      *Move         `json:"move,omitempty"`
	Err       *wireError    `json:"error,omitempty"`
}

// wireError carries an error across nodes so the caller gets the same sentinel (or
// ConflictError) the controller's state machine returned.
type wireError struct {
	Code string `json:"code"`
	Msg  string `json:"msg"`
	// OutcomeUnknown marks an "unavailable" that is ErrOutcomeUnknown. It is a field
	// beside the code, not a code of its own: a node of an earlier version ignores it and
	// reads the "unavailable" it knows (an unknown code would reach its client as a 500).
	OutcomeUnknown bool `json:"outcome_unknown,omitempty"`
}

var wireSentinels = []struct {
	code string
	err  error
}{
	{"topic_exists", ErrTopicExists},
	{"topic_not_found", ErrTopicNotFound},
	{"user_exists", ErrUserExists},
	{"user_not_found", ErrUserNotFound},
	{"child_not_found", ErrChildNotFound},
	{"last_admin", ErrLastAdmin},
	{"member_not_found", ErrMemberNotFound},
	{"partition_not_found", ErrPartitionNotFound},
	{"move_not_found", ErrMoveNotFound},
	{"node_id_in_use", ErrNodeIDInUse},
	{"version_unsupported", ErrVersionUnsupported},
	{"version_gated", ErrVersionGated}, // before unavailable, of which it is a kind
	{"not_leader", ErrNotLeader},
	{"halted", ErrHalted},
	{"no_forwarder", ErrNoForwarder},
	{"unavailable", ErrUnavailable},
}

func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	var ce *ConflictError
	if errors.As(err, &ce) {
		return &wireError{Code: "conflict", Msg: ce.Msg}
	}
	for _, s := range wireSentinels {
		if errors.Is(err, s.err) {
			return &wireError{Code: s.code, Msg: err.Error(), OutcomeUnknown: errors.Is(err, ErrOutcomeUnknown)}
		}
	}
	return &wireError{Code: "error", Msg: err.Error()}
}

func fromWire(w *wireError) error {
	if w == nil {
		return nil
	}
	if w.Code == "conflict" {
		return &ConflictError{Msg: w.Msg}
	}
	if w.OutcomeUnknown && w.Code == "unavailable" {
		return &remoteError{err: ErrOutcomeUnknown, msg: w.Msg}
	}
	for _, s := range wireSentinels {
		if w.Code == s.code {
			if w.Msg == s.err.Error() {
				return s.err
			}
			return &remoteError{err: s.err, msg: w.Msg}
		}
	}
	return errors.New(w.Msg)
}

// remoteError is a sentinel with the remote node's fuller message.
type remoteError struct {
	err error
	msg string
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.err }

// forward sends req to addr and decodes the answer, whose error is the remote one.
func (s *Store) forward(ctx context.Context, addr raft.ServerAddress, req fwdRequest) (fwdResponse, error) {
	if s.opts.Cluster.Forwarder == nil {
		return fwdResponse{}, ErrNoForwarder
	}
	b, err := json.Marshal(req)
	if err != nil {
		return fwdResponse{}, err
	}
	out, err := s.opts.Cluster.Forwarder.Forward(ctx, addr, b)
	if errors.Is(err, ErrNotDelivered) {
		return fwdResponse{}, fmt.Errorf("%w: reaching %s: %w", ErrUnavailable, addr, err)
	}
	// A write that may have reached the controller, with no answer read, may have
	// happened.
	unknown := ErrUnavailable
	if req.Kind == kindApply {
		unknown = ErrOutcomeUnknown
	}
	if err != nil {
		return fwdResponse{}, fmt.Errorf("%w: reaching %s: %v", unknown, addr, err)
	}
	var resp fwdResponse
	if err := json.Unmarshal(out, &resp); err != nil {
		return fwdResponse{}, fmt.Errorf("%w: unreadable answer from %s: %v", unknown, addr, err)
	}
	return resp, fromWire(resp.Err)
}

// HandleForward answers a request another node's Forwarder sent: the node plane calls
// it for every control-plane request it receives. The answer carries any error of the
// request itself; the returned error is only for a request that could not be read.
func (s *Store) HandleForward(ctx context.Context, req []byte) ([]byte, error) {
	var r fwdRequest
	if err := json.Unmarshal(req, &r); err != nil {
		return nil, fmt.Errorf("meta: unreadable forwarded request: %w", err)
	}
	resp := s.handle(ctx, r)
	return json.Marshal(resp)
}

func (s *Store) handle(ctx context.Context, r fwdRequest) fwdResponse {
	if r.Kind == kindIdentity {
		info := s.identityInfo()
		return fwdResponse{Info: &info}
	}
	if !s.Leader() {
		// Pass it on to the controller, once.
		if r.Hops > 0 || r.Kind == kindApply || r.Kind == kindReadIndex || r.Kind == kindSyncIndex {
			// An apply or read index is sent to whom the sender believed leads; it
			// retries with its own, fresher view.
			return fwdResponse{Err: toWire(ErrNotLeader)}
		}
		addr, _ := s.raft.LeaderWithID()
		if addr == "" {
			return fwdResponse{Err: toWire(fmt.Errorf("%w: no controller known", ErrUnavailable))}
		}
		r.Hops++
		resp, err := s.forward(ctx, addr, r)
		resp.Err = toWire(err)
		return resp
	}
	if err := s.fsm.haltedErr(); err != nil && r.Kind != kindSyncIndex {
		// A halted controller hands over (handOverHalted); until then the sender tries
		// again. Its applied index would be stale, and it cannot apply a write. Its log
		// (sync_index reads it) is still right.
		return fwdResponse{Err: toWire(errHaltedLeader(err))}
	}
	switch r.Kind {
	case kindApply:
		c, err := decodeCommand(r.Cmd)
		if err != nil {
			return fwdResponse{Err: toWire(fmt.Errorf("meta: refusing a forwarded command: %w", err))}
		}
		if err := s.gateCmd(c); err != nil {
			return fwdResponse{Err: toWire(err)}
		}
		res, err := s.applyLocal(c)
		return resultResponse(res, err)
	case kindReadIndex:
		if err := s.awaitRead(s.raft.Barrier(s.opts.ApplyTimeout), "barrier"); err != nil {
			return fwdResponse{Err: toWire(err)}
		}
		// The barrier returned once the state machine applied everything before it, so
		// its last command is what a follower must have applied to be current.
		return fwdResponse{Index: s.fsm.applied.Load()}
	case kindSyncIndex:
		idx, err := s.leaderIndex()
		if err != nil {
			return fwdResponse{Err: toWire(err)}
		}
		idx = s.writesThrough(idx)
		if r.Commit > 0 && r.Commit < idx {
			// It would otherwise wait up to twice CommitTimeout to learn idx committed.
			s.nudge()
		}
		return fwdResponse{Index: idx}
	case kindJoin:
		if r.Join == nil {
			return fwdResponse{Err: toWire(errors.New("meta: join without a node"))}
		}
		return fwdResponse{Err: toWire(s.admit(ctx, *r.Join))}
	case kindAdd:
		if r.Add == nil {
			return fwdResponse{Err: toWire(errors.New("meta: add without a node"))}
		}
		return fwdResponse{Err: toWire(s.addByAddress(ctx, *r.Add))}
	case kindHeartbeat:
		if r.Beat == nil {
			return fwdResponse{Err: toWire(errors.New("meta: heartbeat without a node"))}
		}
		return fwdResponse{Err: toWire(s.heard(*r.Beat))}
	case kindMaxEnd:
		if !s.Leader() {
			return fwdResponse{Err: toWire(ErrNotLeader)}
		}
		return fwdResponse{Index: s.ctl.maxEnd(r.Group)}
	}
	return fwdResponse{Err: toWire(fmt.Errorf("meta: unknown request kind %q; this node may run an older version", r.Kind))}
}

func resultResponse(res applyResult, err error) fwdResponse {
	resp := fwdResponse{ClusterID: res.clusterID, Index: res.index, Err: toWire(err)}
	if res.topic.Name != "" {
		t := res.topic
		resp.Topic = &t
	}
	if res.user.Name != "" {
		u := res.user
		resp.User = &u
	}
	if res.move.ID != 0 {
		mv := res.move
		resp.Move = &mv
	}
	return resp
}

// leaderErr turns Raft's errors into this package's: ErrNotLeader when the write
// certainly did not happen here, ErrOutcomeUnknown when it may have, ErrUnavailable
// otherwise. Raft refuses an entry during a leadership transfer before appending it, so
// that one is certainly not written either: the write is sent again once the handover
// ends. A controller that lost its leadership (cut off from its quorum, it stepped down)
// or shut down while holding the entry may have had it committed, or committed by the
// next controller, which holds it too.
func leaderErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	case errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}
