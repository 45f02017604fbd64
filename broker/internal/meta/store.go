package meta

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// Options configures a Store.
type Options struct {
	// Dir holds the Raft log, stable store and snapshots.
	Dir string
	// NodeID names this node in the Raft configuration.
	NodeID string
	// Logger receives Raft's warnings and errors.
	Logger *slog.Logger
	// ApplyTimeout bounds a metadata write; past it the write answers ErrUnavailable.
	ApplyTimeout time.Duration
	// OnChange is called after every change to the state (from the Raft goroutine; it
	// must not block on Store calls that write).
	OnChange func()
}

// Store is the control-plane state machine and the Raft node that replicates it.
type Store struct {
	opts  Options
	fsm   *fsm
	raft  *raft.Raft
	bolt  *raftboltdb.BoltStore
	trans *raft.InmemTransport
}

// Open starts the Raft node, bootstrapping a cluster of one on first start.
func Open(opts Options) (*Store, error) {
	if opts.ApplyTimeout == 0 {
		opts.ApplyTimeout = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	// The directory's entry must be durable before the first metadata write commits.
	if err := vfs.MkdirAllSync(vfs.OS{}, opts.Dir, 0o700); err != nil {
		return nil, err
	}
	f := newFSM()
	f.onChange = opts.OnChange

	cfg := raft.DefaultConfig()
	cfg.LocalID = raft.ServerID(opts.NodeID)
	// A cluster of one elects itself as soon as its heartbeat timeout passes; keep that
	// short so a restart is ready quickly.
	cfg.HeartbeatTimeout = 200 * time.Millisecond
	cfg.ElectionTimeout = 200 * time.Millisecond
	cfg.LeaderLeaseTimeout = 100 * time.Millisecond
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Error, Output: slogWriter{opts.Logger}})

	bolt, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(opts.Dir, "raft.db")})
	if err != nil {
		return nil, fmt.Errorf("meta: opening raft store: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(opts.Dir, 2, cfg.Logger)
	if err != nil {
		bolt.Close()
		return nil, fmt.Errorf("meta: opening snapshots: %w", err)
	}
	addr, trans := raft.NewInmemTransport(raft.ServerAddress(opts.NodeID))
	has, err := raft.HasExistingState(bolt, bolt, snaps)
	if err != nil {
		bolt.Close()
		return nil, fmt.Errorf("meta: reading raft state: %w", err)
	}
	if !has {
		conf := raft.Configuration{Servers: []raft.Server{{ID: cfg.LocalID, Address: addr}}}
		if err := raft.BootstrapCluster(cfg, bolt, bolt, snaps, trans, conf); err != nil {
			bolt.Close()
			return nil, fmt.Errorf("meta: bootstrap: %w", err)
		}
	}
	r, err := raft.NewRaft(cfg, f, bolt, bolt, snaps, trans)
	if err != nil {
		bolt.Close()
		return nil, fmt.Errorf("meta: starting raft: %w", err)
	}
	return &Store{opts: opts, fsm: f, raft: r, bolt: bolt, trans: trans}, nil
}

// WaitReady blocks until this node leads and has applied every committed entry, so its
// view of the topics is current. Destructive clean-up must wait for it.
func (s *Store) WaitReady(ctx context.Context) error {
	for {
		if s.raft.State() == raft.Leader {
			if err := s.raft.Barrier(s.opts.ApplyTimeout).Error(); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: no leader: %v", ErrUnavailable, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// AppliedIndex returns the index of the last Raft entry applied to the state.
func (s *Store) AppliedIndex() uint64 { return s.raft.AppliedIndex() }

// Leader reports whether this node leads the control plane.
func (s *Store) Leader() bool { return s.raft.State() == raft.Leader }

// NodeID returns this node's id.
func (s *Store) NodeID() string { return s.opts.NodeID }

func (s *Store) applyCmd(c command) (applyResult, error) {
	// Never propose what Apply would refuse: a refused entry stops every replica.
	if err := c.check(); err != nil {
		return applyResult{}, fmt.Errorf("meta: %w", err)
	}
	b, err := encodeCommand(c)
	if err != nil {
		return applyResult{}, err
	}
	fut := s.raft.Apply(b, s.opts.ApplyTimeout)
	if err := fut.Error(); err != nil {
		return applyResult{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	res := fut.Response().(applyResult)
	return res, res.err
}

func (s *Store) apply(c command) (Topic, error) {
	res, err := s.applyCmd(c)
	return res.topic, err
}

func (s *Store) applyUser(c command) (auth.User, error) {
	res, err := s.applyCmd(c)
	return res.user, err
}

// CreateUser stores a new user; with seed it applies only while no admin was ever seeded.
// A name equal to an existing user's but for case is ErrUserExists: usernames are
// unique regardless of case (logins still match them exactly).
func (s *Store) CreateUser(u auth.User, seed bool) (auth.User, error) {
	s.fsm.mu.RLock()
	taken := s.fsm.nameTaken(u.Name)
	s.fsm.mu.RUnlock()
	if taken {
		return auth.User{}, ErrUserExists
	}
	return s.applyUser(command{Op: "create_user", User: &u, Seed: seed, Rules: cmdRules})
}

// DeleteUser removes a user; ErrLastAdmin when it is the last holding admin on "*".
func (s *Store) DeleteUser(name string) (auth.User, error) {
	// Refuse what the state would refuse without writing it to the log, where an older
	// binary (after a rollback) would replay it under its own rules. The state machine
	// checks again, for changes racing this one.
	if s.fsm.leavesNoAdmin(name, nil) {
		return auth.User{}, ErrLastAdmin
	}
	return s.applyUser(command{Op: "delete_user", Name: name, Rules: cmdRules})
}

// SetGrants replaces a user's grants; ErrLastAdmin when that would leave no user
// holding admin on "*".
func (s *Store) SetGrants(name string, gs []auth.Grant) (auth.User, error) {
	if gs == nil {
		gs = []auth.Grant{}
	}
	if s.fsm.leavesNoAdmin(name, gs) {
		return auth.User{}, ErrLastAdmin
	}
	return s.applyUser(command{Op: "set_grants", Name: name, Grants: gs, Rules: cmdRules})
}

// RestoreAdmin is the break-glass for a cluster where no user holds admin on "*" (a
// data directory from a version that let the last admin go): it gives the user of
// u.Name (created if need be) the hash u.Hash and admin on "*". ErrUserExists, and no
// change, while any user holds admin on "*".
func (s *Store) RestoreAdmin(u auth.User) (auth.User, error) {
	return s.applyUser(command{Op: "restore_admin", User: &u, Rules: cmdRules})
}

// HasAdmin reports whether any user holds admin on "*".
func (s *Store) HasAdmin() bool { return s.fsm.hasAdmin() }

// SetPassword replaces a user's password hash.
func (s *Store) SetPassword(name string, hash []byte) (auth.User, error) {
	return s.applyUser(command{Op: "set_password", Name: name, Hash: hash})
}

// User returns the user of that name as this node knows it.
func (s *Store) User(name string) (auth.User, bool) { return s.fsm.user(name) }

// UserByID returns the user with that ID as this node knows it; false when no user has
// it (IDs are never reused, so a deleted user's ID finds nobody).
func (s *Store) UserByID(id uint64) (auth.User, bool) { return s.fsm.userByID(id) }

// Users returns every user, sorted by name.
func (s *Store) Users() []auth.User { return s.fsm.userList() }

// CreateTopic stores a new topic and returns it with its incarnation. With t.Parent set
// the topic is created attached to that parent, copying from start (the parent's next
// offset per partition), or not created at all.
func (s *Store) CreateTopic(t Topic, start ...uint64) (Topic, error) {
	return s.apply(command{Op: "create_topic", Topic: &t, Start: start})
}

// AttachChild links child under parent with a delay, copying from start (per parent
// partition), which was read from parent incarnation parentInc: the attach is refused
// with a ConflictError if the parent is another incarnation by then (0: not checked).
func (s *Store) AttachChild(parent string, parentInc uint64, child string, delayMs int64, start []uint64) (Topic, error) {
	return s.apply(command{Op: "attach_child", Name: parent, ParentInc: parentInc, Child: child, Delay: delayMs, Start: start})
}

// DetachChild unlinks child from parent.
func (s *Store) DetachChild(parent, child string) (Topic, error) {
	return s.apply(command{Op: "detach_child", Name: parent, Child: child})
}

// DeleteTopic removes the topic name; with incarnation != 0 only that incarnation.
func (s *Store) DeleteTopic(name string, incarnation uint64) (Topic, error) {
	return s.apply(command{Op: "delete_topic", Name: name, Topic: &Topic{Incarnation: incarnation}})
}

// AlterTopic changes a topic's live-tunable settings.
func (s *Store) AlterTopic(name string, a Alter) (Topic, error) {
	return s.apply(command{Op: "alter_topic", Name: name, Alter: &a})
}

// Topic returns the topic of that name as this node knows it.
func (s *Store) Topic(name string) (Topic, bool) { return s.fsm.topic(name) }

// Topics returns every topic, sorted by name.
func (s *Store) Topics() []Topic { return s.fsm.list() }

// Close stops the Raft node and closes its stores.
func (s *Store) Close() error {
	err := s.raft.Shutdown().Error()
	if cerr := s.bolt.Close(); err == nil {
		err = cerr
	}
	return err
}

// slogWriter adapts Raft's hclog output to the process logger.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn("raft", "line", string(trimNL(p)))
	return len(p), nil
}

func trimNL(p []byte) []byte {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	return p
}

var _ io.Writer = slogWriter{}
