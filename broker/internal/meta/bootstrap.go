package meta

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// identityInfo is this node's answer to "who are you": its ids and whether it holds a
// Raft configuration (is in a cluster already).
func (s *Store) identityInfo() identityInfo {
	formed := false
	if conf, err := s.configuration(); err == nil {
		formed = len(conf.Servers) > 0
	}
	lo, hi := s.Versions()
	return identityInfo{NodeID: s.opts.NodeID, ServerID: s.ServerID(), HTTPAddr: s.opts.Cluster.HTTPAddr, Formed: formed, MinVersion: lo, MaxVersion: hi}
}

// bootstrapLoop forms a new cluster from the static peer list. Raft server ids carry
// each node's disk id, which only that node knows, so the node first asks every peer
// who it is; once all answered, it bootstraps the configuration of all of them (every
// peer computes the same one). If a peer is in a cluster already (the others formed it
// while this node was down, or this node's data directory was wiped), it joins through
// that peer instead.
func (s *Store) bootstrapLoop() {
	for {
		servers := []raft.Server{{ID: s.id.serverID(), Address: s.addr, Suffrage: raft.Voter}}
		var formed raft.ServerAddress
		missing := 0
		for _, p := range s.opts.Cluster.Peers {
			if p.ID == s.opts.NodeID {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.ApplyTimeout)
			resp, err := s.forward(ctx, p.Addr, fwdRequest{Kind: kindIdentity})
			cancel()
			switch {
			case err != nil || resp.Info == nil:
				missing++
			case resp.Info.NodeID != p.ID:
				missing++
				s.opts.Logger.Error("meta: a peer is another node than the peer list says; fix the peer list", "address", p.Addr, "listed", p.ID, "is", resp.Info.NodeID)
			case resp.Info.Formed:
				formed = p.Addr
			default:
				servers = append(servers, raft.Server{ID: raft.ServerID(resp.Info.ServerID), Address: p.Addr, Suffrage: raft.Voter})
			}
		}
		if s.hasConfiguration() {
			return // a leader reached this node: it is in the cluster
		}
		if formed != "" {
			s.joinLoop(formed)
			return
		}
		if missing == 0 {
			err := s.raft.BootstrapCluster(raft.Configuration{Servers: sortedServers(servers)}).Error()
			if err == nil || errors.Is(err, raft.ErrCantBootstrap) {
				return
			}
			s.opts.Logger.Error("meta: bootstrapping the cluster failed; retrying", "err", err)
		}
		if !s.sleep(100 * time.Millisecond) {
			return
		}
	}
}

func (s *Store) hasConfiguration() bool {
	conf, err := s.configuration()
	return err == nil && len(conf.Servers) > 0
}

// joinLoop asks the member at addr to admit this node, until it is admitted or the
// store closes. A refusal is kept for WaitReady to report.
func (s *Store) joinLoop(addr raft.ServerAddress) {
	for s.joinOnce(addr) != nil {
		if !s.sleep(200 * time.Millisecond) {
			return
		}
	}
}

// joinOnce asks the member at addr (which passes it on to the controller) to admit
// this node. A refusal is kept for WaitReady to report, and logged when it differs from
// the one before.
func (s *Store) joinOnce(addr raft.ServerAddress) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ApplyTimeout)
	j := s.self()
	_, err := s.forward(ctx, addr, fwdRequest{Kind: kindJoin, Join: &j})
	cancel()
	if err == nil {
		s.joinErr.Store(nil)
		s.opts.Logger.Info("meta: joined the cluster", "through", addr)
		return nil
	}
	err = fmt.Errorf("joining through %s: %w", addr, err)
	if p := s.joinErr.Load(); p == nil || toWire(*p).Code != toWire(err).Code {
		s.opts.Logger.Warn("meta: join refused or failed; retrying", "err", err)
	}
	s.joinErr.Store(&err)
	return err
}

// standingInFor returns the Raft server id this node is taken for, when the
// configuration it follows names another server of its node id and not its own: its
// data directory was wiped (a new disk id) and the leader's replication to the old
// server, at the same address, reached it before it joined, or it restarted since.
// Until the controller replaces the old server, the leader counts this node's answers
// as the old one's, and the controller refuses its heartbeats (another server id), so
// it would stay dead to the cluster for good. "" when the node is itself, or the
// configuration does not name its node id at all (not admitted yet, or removed).
func (s *Store) standingInFor() string {
	conf, err := s.configuration()
	if err != nil {
		return ""
	}
	old := ""
	for _, srv := range conf.Servers {
		switch {
		case srv.ID == s.id.serverID():
			return ""
		case nodeOfServer(string(srv.ID)) == s.opts.NodeID:
			old = string(srv.ID)
		}
	}
	return old
}
