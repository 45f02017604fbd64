package meta

import (
	"bytes"
	"fmt"
	"sort"
)

// RemoteChild is a remote child: a topic of another cluster that every message
// committed to Parent is copied to. The control plane holds it whole (the broker runs
// the copy), so the cursor is replicated like the rest of the cluster's state and a
// failover carries on where the copy stood.
type RemoteChild struct {
	// ID is the Raft index of the attach: unique for the life of the cluster, so a
	// detach and re-attach of the same remote topic is a new child with new cursors.
	ID                uint64 `json:"id"`
	Parent            string `json:"parent"`
	ParentIncarnation uint64 `json:"parent_incarnation"`
	// URL and Topic name the child: the remote cluster's base URL and its topic.
	URL   string `json:"url"`
	Topic string `json:"topic"`
	// Username and Sealed are the credentials the copy produces with. Sealed is the
	// password encrypted by the broker under a key derived from the cluster secret: the
	// control plane (its log, snapshots and backups) never holds it in clear.
	Username string `json:"username"`
	Sealed   []byte `json:"sealed"`
	// CAPEM, when set, is the certificates trusted for an https URL.
	CAPEM string `json:"ca_pem,omitempty"`
	// RemoteIncarnation is the remote topic's incarnation at attach: every batch names
	// it, so a remote topic deleted and created again refuses the copy, not merges it.
	RemoteIncarnation string `json:"remote_incarnation"`
	RemoteClusterID   string `json:"remote_cluster_id,omitempty"`
	// RemotePartitions is the remote topic's partition count at attach (it cannot
	// change within an incarnation): copies are placed by it.
	RemotePartitions int32 `json:"remote_partitions,omitempty"`
	// Start is "now" or "earliest", as asked at attach.
	Start string `json:"start"`
	// OwnerID is the user who attached it, or last changed its URL, user or CA in
	// place (0: security was off); with security on the copy runs while that user may
	// consume Parent.
	OwnerID     uint64 `json:"owner_id,omitempty"`
	CreatedAtMs int64  `json:"created_at_ms"`
	// Cursors is per parent partition the next offset to copy: every message before it
	// was answered 202 by the remote. Moved only by move_remote_cursor.
	Cursors []uint64 `json:"cursors"`
	// Expired counts per parent partition the messages retention deleted before they
	// were copied.
	Expired []uint64 `json:"expired,omitempty"`
	// Paused is set by the pause route; the copy stops until it is resumed.
	Paused bool `json:"paused,omitempty"`
}

// RemoteOp is the argument of the commands that change a remote child.
type RemoteOp struct {
	ID uint64 `json:"id"`
	// Partition, From, To and Expired, on move_remote_cursor: the parent partition's
	// cursor moves from From to To (only if it is at From, so a command applied twice
	// or racing another moves it once), and Expired more messages were lost to retention
	// (at most To-From: the messages it skips).
	Partition int32  `json:"partition,omitempty"`
	From      uint64 `json:"from,omitempty"`
	To        uint64 `json:"to,omitempty"`
	Expired   uint64 `json:"expired,omitempty"`
	// Paused, on pause_remote: pause (true) or resume (false).
	Paused bool `json:"paused,omitempty"`
	// Sealed, on reseal_remote: the password sealed under the current key; on
	// update_remote, sealed for the new URL and username.
	Sealed []byte `json:"sealed,omitempty"`
	// URL, Username and CAPEM, on update_remote: how the child reaches its remote from
	// now on, whole (an empty CAPEM: the system's CAs).
	URL      string `json:"url,omitempty"`
	Username string `json:"username,omitempty"`
	CAPEM    string `json:"ca_pem,omitempty"`
	// PrevSealed, on update_remote: the sealed password the update was made from. The
	// update applies only while the child still holds it, so that two updates (or an
	// update and the reseal of a rotated secret) racing each other cannot leave a
	// password sealed for another URL or user than the child's.
	PrevSealed []byte `json:"prev_sealed,omitempty"`
	// OwnerID, on update_remote, when not 0: the user who changed the child, whose
	// it is from now on, as if they had attached it (the copy runs while they may
	// consume the parent). 0 (a new password, a reseal, security off) keeps the owner.
	OwnerID uint64 `json:"owner_id,omitempty"`
}

// MaxRemoteChildren is how many remote children one topic may have.
const MaxRemoteChildren = 16

func (c command) checkRemote() error {
	bad := func(why string) error { return fmt.Errorf("%s command %s", c.Op, why) }
	switch c.Op {
	case "attach_remote":
		r := c.Remote
		if r == nil || r.Parent == "" || r.URL == "" || r.Topic == "" || len(r.Cursors) == 0 {
			return bad("without a parent, remote URL, topic and cursors")
		}
	case "detach_remote", "pause_remote", "reseal_remote", "move_remote_cursor", "update_remote":
		if c.RemoteOp == nil || c.RemoteOp.ID == 0 {
			return bad("without a remote child id")
		}
		if c.Op == "detach_remote" && c.Name == "" {
			return bad("without a parent")
		}
		if c.Op == "update_remote" && (c.RemoteOp.URL == "" || c.RemoteOp.Username == "" || len(c.RemoteOp.Sealed) == 0 || len(c.RemoteOp.PrevSealed) == 0) {
			return bad("without the URL, username, sealed password and the sealed password it replaces")
		}
	}
	return nil
}

// applyRemote applies the remote-child commands. Called with f.mu held.
func (f *fsm) applyRemote(index uint64, c command) applyResult {
	if f.remotes == nil {
		f.remotes = make(map[uint64]RemoteChild)
	}
	if c.Op == "attach_remote" {
		r := *c.Remote
		p, ok := f.topics[r.Parent]
		if !ok || (r.ParentIncarnation != 0 && r.ParentIncarnation != p.Incarnation) {
			return applyResult{err: ErrTopicNotFound}
		}
		if len(r.Cursors) != int(p.Partitions) {
			return conflict("attach start offsets do not match topic %s's partitions", r.Parent)
		}
		n := 0
		for _, x := range f.remotes {
			if x.Parent != r.Parent {
				continue
			}
			n++
			if x.URL == r.URL && x.Topic == r.Topic {
				return conflict("topic %s at %s is already a remote child of %s (remote:%d); detach it first", r.Topic, r.URL, r.Parent, x.ID)
			}
		}
		if n >= MaxRemoteChildren {
			return conflict("topic %s has %d remote children, the most allowed", r.Parent, MaxRemoteChildren)
		}
		r.ID, r.ParentIncarnation = index, p.Incarnation
		r.Cursors = append([]uint64(nil), r.Cursors...)
		r.Expired = make([]uint64, len(r.Cursors))
		f.remotes[r.ID] = r
		return applyResult{remote: r}
	}
	op := c.RemoteOp
	r, ok := f.remotes[op.ID]
	if !ok || (c.Op == "detach_remote" && r.Parent != c.Name) {
		return applyResult{err: ErrChildNotFound}
	}
	switch c.Op {
	case "detach_remote":
		delete(f.remotes, op.ID)
	case "pause_remote":
		r.Paused = op.Paused
	case "reseal_remote":
		r.Sealed = op.Sealed
	case "update_remote":
		if !bytes.Equal(r.Sealed, op.PrevSealed) {
			return conflict("remote child %d was given other credentials or settings meanwhile; read it again and retry", op.ID)
		}
		for _, x := range f.remotes {
			if x.ID != r.ID && x.Parent == r.Parent && x.URL == op.URL && x.Topic == r.Topic {
				return conflict("topic %s at %s is already a remote child of %s (remote:%d)", r.Topic, op.URL, r.Parent, x.ID)
			}
		}
		r.URL, r.Username, r.CAPEM, r.Sealed = op.URL, op.Username, op.CAPEM, op.Sealed
		if op.OwnerID != 0 {
			r.OwnerID = op.OwnerID
		}
	case "move_remote_cursor":
		i := int(op.Partition)
		if i < 0 || i >= len(r.Cursors) {
			return conflict("remote child %d has no partition %d", op.ID, op.Partition)
		}
		if r.Cursors[i] != op.From || op.To < op.From {
			// A command applied twice, or a copier that lost the partition to another
			// node meanwhile: the cursor moves once, never back.
			return conflict("remote child %d partition %d cursor is at %d, not %d", op.ID, i, r.Cursors[i], op.From)
		}
		if op.Expired > op.To-op.From {
			// Only messages the cursor skips can have expired; counting more would also
			// count them again at every application of a move that skips none.
			return conflict("remote child %d partition %d: %d messages expired is more than the %d the cursor skips", op.ID, i, op.Expired, op.To-op.From)
		}
		r.Cursors = append([]uint64(nil), r.Cursors...)
		r.Cursors[i] = op.To
		if op.Expired > 0 {
			r.Expired = append([]uint64(nil), r.Expired...)
			for len(r.Expired) < len(r.Cursors) {
				r.Expired = append(r.Expired, 0)
			}
			r.Expired[i] += op.Expired
		}
	}
	if c.Op != "detach_remote" {
		f.remotes[op.ID] = r
	}
	return applyResult{remote: r}
}

// dropRemoteChildren forgets the remote children of a deleted parent. Called with f.mu
// held.
func (f *fsm) dropRemoteChildren(parent string) {
	for id, r := range f.remotes {
		if r.Parent == parent {
			delete(f.remotes, id)
		}
	}
}

func (f *fsm) remoteList() []RemoteChild {
	f.mu.RLock()
	out := make([]RemoteChild, 0, len(f.remotes))
	for _, r := range f.remotes {
		out = append(out, r)
	}
	f.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// AttachRemoteChild stores a new remote child (its ID is given at apply) and returns it.
func (s *Store) AttachRemoteChild(r RemoteChild) (RemoteChild, error) {
	res, err := s.applyCmd(command{Op: "attach_remote", Remote: &r})
	if err != nil {
		return RemoteChild{}, err
	}
	if got, ok := s.RemoteChild(res.index); ok {
		return got, nil
	}
	return res.remote, nil
}

// DetachRemoteChild forgets remote child id of parent (ErrChildNotFound when it has none
// of that id).
func (s *Store) DetachRemoteChild(parent string, id uint64) error {
	_, err := s.applyCmd(command{Op: "detach_remote", Name: parent, RemoteOp: &RemoteOp{ID: id}})
	return err
}

// PauseRemoteChild pauses (or resumes) remote child id.
func (s *Store) PauseRemoteChild(id uint64, paused bool) error {
	_, err := s.applyCmd(command{Op: "pause_remote", RemoteOp: &RemoteOp{ID: id, Paused: paused}})
	return err
}

// ResealRemoteChild replaces remote child id's sealed password.
func (s *Store) ResealRemoteChild(id uint64, sealed []byte) error {
	_, err := s.applyCmd(command{Op: "reseal_remote", RemoteOp: &RemoteOp{ID: id, Sealed: sealed}})
	return err
}

// UpdateRemoteChild replaces how remote child id reaches its remote (URL, username, CA
// certificates) and its sealed password, while it still holds prevSealed (a
// ConflictError otherwise), and makes it user owner's (0: the owner stays). Its
// cursors stay.
func (s *Store) UpdateRemoteChild(id uint64, url, username, caPEM string, sealed, prevSealed []byte, owner uint64) (RemoteChild, error) {
	res, err := s.applyCmd(command{Op: "update_remote", RemoteOp: &RemoteOp{ID: id, URL: url, Username: username, CAPEM: caPEM, Sealed: sealed, PrevSealed: prevSealed, OwnerID: owner}})
	if err != nil {
		return RemoteChild{}, err
	}
	return res.remote, nil
}

// MoveRemoteCursor moves partition part of remote child id from from to to, counting
// expired messages lost to retention. A ConflictError when the cursor is not at from.
func (s *Store) MoveRemoteCursor(id uint64, part int32, from, to, expired uint64) error {
	_, err := s.applyCmd(command{Op: "move_remote_cursor", RemoteOp: &RemoteOp{ID: id, Partition: part, From: from, To: to, Expired: expired}})
	return err
}

// RemoteChild returns remote child id as this node knows it.
func (s *Store) RemoteChild(id uint64) (RemoteChild, bool) {
	s.fsm.mu.RLock()
	defer s.fsm.mu.RUnlock()
	r, ok := s.fsm.remotes[id]
	return r, ok
}

// RemoteChildren returns every remote child, by ID.
func (s *Store) RemoteChildren() []RemoteChild { return s.fsm.remoteList() }
