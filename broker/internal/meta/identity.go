package meta

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// ErrNodeIDMismatch means the data directory belongs to another node id than the one
// this node was started with.
var ErrNodeIDMismatch = errors.New("meta: node id differs from the data directory's")

// ErrNodeIDInUse means another live member holds this node id with another data
// directory (Raft server id).
var ErrNodeIDInUse = errors.New("meta: node id in use by a live member")

// ErrForeignConfiguration means meta/ holds a Raft configuration this node cannot start
// from as it is.
var ErrForeignConfiguration = errors.New("meta: the stored Raft configuration is not this node's")

// identity is written once, when the metadata directory is made (or first opened by
// this version): the node id it belongs to and a random disk id. The node's Raft
// server id is "<node id>/<disk id>", so a node whose data directory was wiped comes
// back as a new Raft server and can never vote with a history it lost.
type identity struct {
	NodeID string `json:"node_id"`
	DiskID string `json:"disk_id"`
}

func (id identity) serverID() raft.ServerID { return raft.ServerID(id.NodeID + "/" + id.DiskID) }

const identityFile = "identity.json"

func randomID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// loadIdentity reads dir's identity, or makes one for nodeID. stored is the Raft
// configuration the directory holds (empty when it holds none): a directory of the
// single-node version has no identity file, and its configuration names the node id
// it was started with, which must be nodeID.
func loadIdentity(dir, nodeID string, stored raft.Configuration) (identity, error) {
	path := filepath.Join(dir, identityFile)
	b, err := os.ReadFile(path)
	if err == nil {
		var id identity
		if err := json.Unmarshal(b, &id); err != nil || id.NodeID == "" || id.DiskID == "" {
			return identity{}, fmt.Errorf("meta: %s is damaged (%v); restore it from a backup", path, err)
		}
		if id.NodeID != nodeID {
			return identity{}, fmt.Errorf("%w: %s belongs to node %q, this node was started as %q; start it with --node-id %s or use another data directory", ErrNodeIDMismatch, dir, id.NodeID, nodeID, id.NodeID)
		}
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return identity{}, err
	}
	if len(stored.Servers) == 1 && nodeOfServer(string(stored.Servers[0].ID)) != nodeID {
		old := nodeOfServer(string(stored.Servers[0].ID))
		return identity{}, fmt.Errorf("%w: %s belongs to node %q, this node was started as %q; start it with --node-id %s or use another data directory", ErrNodeIDMismatch, dir, old, nodeID, old)
	}
	id := identity{NodeID: nodeID, DiskID: randomID()}
	js, _ := json.Marshal(id)
	if err := vfs.WriteFileSync(path, append(js, '\n')); err != nil {
		return identity{}, fmt.Errorf("meta: writing %s: %w", path, err)
	}
	return id, nil
}

// storedConfiguration returns the latest Raft configuration in the stores: the last
// configuration entry in the log, or the latest snapshot's when the log has none past
// it.
func storedConfiguration(logs raft.LogStore, snaps raft.SnapshotStore) (raft.Configuration, error) {
	var conf raft.Configuration
	var confIndex uint64
	metas, err := snaps.List()
	if err != nil {
		return conf, err
	}
	if len(metas) > 0 {
		conf, confIndex = metas[0].Configuration, metas[0].ConfigurationIndex
	}
	first, err := logs.FirstIndex()
	if err != nil {
		return conf, err
	}
	last, err := logs.LastIndex()
	if err != nil {
		return conf, err
	}
	for i := max(first, confIndex+1); first > 0 && i <= last; i++ {
		var l raft.Log
		if err := logs.GetLog(i, &l); err != nil {
			return conf, fmt.Errorf("reading Raft log entry %d: %w", i, err)
		}
		if l.Type == raft.LogConfiguration {
			conf = raft.DecodeConfiguration(l.Data)
		}
	}
	return conf, nil
}

// needsRecovery decides what to do with the stored configuration when this node is
// server self at addr: nothing (true only when it must be rewritten to a configuration
// of just this node), or an error when starting from it would be unsafe.
//
//   - Empty (a node that is joining): nothing.
//   - Names self at addr, or self among several servers: nothing (the controller owns
//     a cluster's addresses).
//   - Exactly one server, that is this node under its single-node server id (the node
//     id, with an in-memory address) or self at another address: recover to a cluster
//     of just self at addr, so the data directory of the single-node version, or a lone
//     node moving to the node plane, opens with everything intact.
//   - Exactly one server that is another node: refuse.
//   - Several servers without self: nothing; a node that joined may have crashed after
//     storing entries before the one that added it.
func needsRecovery(conf raft.Configuration, id identity, addr raft.ServerAddress) (bool, error) {
	self := id.serverID()
	switch {
	case len(conf.Servers) == 0:
		return false, nil
	case len(conf.Servers) == 1:
		s := conf.Servers[0]
		if s.ID == self && s.Address == addr {
			return false, nil
		}
		if s.ID == self || s.ID == raft.ServerID(id.NodeID) {
			return true, nil
		}
		return false, fmt.Errorf("%w: it is a cluster of one whose server is %q, this node is %q; use this node's own data directory", ErrForeignConfiguration, s.ID, self)
	}
	return false, nil
}
