package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/cluster"
	"github.com/narad-mq/narad/broker/internal/meta"
)

// minSecretLen is the node plane's shortest cluster secret (transport.MinSecretLen),
// checked here too so that the refusal names the flag.
const minSecretLen = 16

// validateCluster checks the cluster flags: none of them without --cluster-addr, and
// with it a secret, addresses others can dial, and one way to find the cluster.
func (c config) validateCluster() error {
	if c.ClusterAddr == "" {
		for name, set := range map[string]bool{
			"--peers": c.Peers != "", "--join": c.Join != "", "--wait-for-add": c.WaitForAdd,
			"--advertise-cluster-addr": c.AdvertiseClusterAddr != "",
		} {
			if set {
				return fmt.Errorf("%s needs --cluster-addr (the UDP host:port of this node's node plane)", name)
			}
		}
		_, err := c.httpAdvertise()
		return err
	}
	if _, err := portOf(c.ClusterAddr, "--cluster-addr"); err != nil {
		return err
	}
	if c.AdvertiseClusterAddr != "" {
		if _, err := portOf(c.AdvertiseClusterAddr, "--advertise-cluster-addr"); err != nil {
			return err
		}
	}
	if isWildcard(c.advertisedClusterAddr()) {
		return fmt.Errorf("--cluster-addr %s binds every interface, so other nodes cannot be told where to reach this one: set --advertise-cluster-addr host:port", c.ClusterAddr)
	}
	ways := 0
	for _, set := range []bool{c.Peers != "", c.Join != "", c.WaitForAdd} {
		if set {
			ways++
		}
	}
	if ways > 1 {
		return fmt.Errorf("--peers, --join and --wait-for-add exclude each other: bootstrap a new cluster from --peers, join an existing one with --join, or wait to be added")
	}
	if _, err := c.peers(); err != nil {
		return err
	}
	if c.Join != "" {
		if _, err := portOf(c.Join, "--join"); err != nil {
			return err
		}
	}
	if _, err := c.httpAdvertise(); err != nil {
		return err
	}
	_, _, err := c.clusterSecrets()
	return err
}

// portOf checks that addr is host:port with a port other nodes can dial.
func portOf(addr, flag string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want host:port (%v)", flag, addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return 0, fmt.Errorf("%s %q: the port must be 1 to 65535", flag, addr)
	}
	return port, nil
}

// isWildcard reports whether addr's host binds every interface (empty, 0.0.0.0, ::).
func isWildcard(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// advertisedClusterAddr is the cluster address other nodes dial.
func (c config) advertisedClusterAddr() string {
	if c.AdvertiseClusterAddr != "" {
		return c.AdvertiseClusterAddr
	}
	return c.ClusterAddr
}

// peers parses --peers, id@host:port,...
func (c config) peers() ([]meta.Peer, error) {
	if c.Peers == "" {
		return nil, nil
	}
	var out []meta.Peer
	ids, addrs := map[string]bool{}, map[string]bool{}
	for _, item := range strings.Split(c.Peers, ",") {
		item = strings.TrimSpace(item)
		id, addr, ok := strings.Cut(item, "@")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("--peers: %q is not id@host:port", item)
		}
		if _, err := portOf(addr, "--peers "+id); err != nil {
			return nil, err
		}
		if ids[id] || addrs[addr] {
			return nil, fmt.Errorf("--peers names %s or %s twice", id, addr)
		}
		ids[id], addrs[addr] = true, true
		out = append(out, meta.Peer{ID: id, Addr: raft.ServerAddress(addr)})
	}
	return out, nil
}

// httpAdvertise is the HTTP URL this node advertises to the others: --advertise-addr,
// or --http-addr with its scheme when it names one interface.
func (c config) httpAdvertise() (string, error) {
	if c.AdvertiseAddr != "" {
		u, err := url.Parse(c.AdvertiseAddr)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", fmt.Errorf("--advertise-addr %q: want an http:// or https:// URL with a host, such as https://node1.example.com:7942", c.AdvertiseAddr)
		}
		return strings.TrimRight(c.AdvertiseAddr, "/"), nil
	}
	if c.ClusterAddr != "" && isWildcard(c.HTTPAddr) {
		return "", fmt.Errorf("--http-addr %s binds every interface, so other nodes and clients cannot be told where this node answers: set --advertise-addr to its URL", c.HTTPAddr)
	}
	scheme := "http"
	if c.TLSCert != "" {
		scheme = "https"
	}
	return scheme + "://" + c.HTTPAddr, nil
}

// clusterSecrets reads the current and next cluster secrets from their files or
// values. The current one is required with --cluster-addr.
func (c config) clusterSecrets() (current, next []byte, err error) {
	current, err = secretFrom("--cluster-secret-file", c.ClusterSecretFile, "--cluster-secret", c.ClusterSecret)
	if err != nil {
		return nil, nil, err
	}
	if current == nil {
		return nil, nil, fmt.Errorf("--cluster-addr needs the cluster secret, the same on every node: set --cluster-secret-file PATH or NARAD_CLUSTER_SECRET (at least %d bytes; make one with: openssl rand -base64 32)", minSecretLen)
	}
	if len(current) < minSecretLen {
		return nil, nil, fmt.Errorf("the cluster secret has %d bytes; at least %d are required (make one with: openssl rand -base64 32)", len(current), minSecretLen)
	}
	next, err = secretFrom("--cluster-secret-next-file", c.ClusterSecretNextFile, "--cluster-secret-next", c.ClusterSecretNext)
	if err != nil {
		return nil, nil, err
	}
	if len(next) == 0 {
		// An empty next-secret file is no next secret: the flag can be set from the
		// start, and a rotation needs only SIGHUPs.
		next = nil
	}
	if next != nil && len(next) < minSecretLen {
		return nil, nil, fmt.Errorf("the next cluster secret has %d bytes; at least %d are required", len(next), minSecretLen)
	}
	return current, next, nil
}

// secretFrom reads a secret from its file (a final line break dropped) or takes its
// value; nil when neither is set.
func secretFrom(fileFlag, file, valueFlag, value string) ([]byte, error) {
	switch {
	case file != "" && value != "":
		return nil, fmt.Errorf("%s and %s (or its NARAD_ variable) exclude each other: keep one", fileFlag, valueFlag)
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fileFlag, err)
		}
		return bytes.TrimRight(b, "\r\n"), nil
	case value != "":
		return []byte(value), nil
	}
	return nil, nil
}

// clusterNodeID is the node id of a cluster node: --node-id, or the one its data
// directory was made with. The node plane needs it before the broker opens.
func (c config) clusterNodeID() (string, error) {
	if c.NodeID != "" {
		return c.NodeID, nil
	}
	b, err := os.ReadFile(filepath.Join(c.DataDir, "node-id"))
	if err == nil && len(bytes.TrimSpace(b)) > 0 {
		return string(bytes.TrimSpace(b)), nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	return "", errors.New("--cluster-addr needs --node-id (or NARAD_NODE_ID) on a new data directory: every node of a cluster needs an id the others can name, such as node1")
}

// startPlane starts the node plane for c; it returns the node id it runs as.
func startPlane(c config, log *slog.Logger) (*cluster.Plane, string, error) {
	id, err := c.clusterNodeID()
	if err != nil {
		return nil, "", err
	}
	current, next, err := c.clusterSecrets()
	if err != nil {
		return nil, "", err
	}
	for _, f := range c.secretFlags {
		log.Warn("the cluster secret was given on the command line, where ps shows it to every user of this machine; use --cluster-secret-file or NARAD_CLUSTER_SECRET", "flag", f)
	}
	p, err := cluster.Start(cluster.Options{
		NodeID: id, ListenAddr: c.ClusterAddr, AdvertiseAddr: c.advertisedClusterAddr(),
		Secret: current, NextSecret: next, Logger: log,
	})
	if err != nil {
		return nil, "", fmt.Errorf("starting the node plane on --cluster-addr %s: %w", c.ClusterAddr, err)
	}
	return p, id, nil
}

// metaCluster is the control plane's place in the cluster, on plane.
func (c config) metaCluster(plane *cluster.Plane) (meta.Cluster, error) {
	peers, err := c.peers()
	if err != nil {
		return meta.Cluster{}, err
	}
	httpAddr, err := c.httpAdvertise()
	if err != nil {
		return meta.Cluster{}, err
	}
	return meta.Cluster{
		Transport:  plane.RaftTransport(),
		LocalAddr:  raft.ServerAddress(plane.Addr()),
		Forwarder:  plane,
		Peers:      peers,
		Join:       raft.ServerAddress(c.Join),
		WaitForAdd: c.WaitForAdd,
		HTTPAddr:   httpAddr,
	}, nil
}

// secretReloader rereads the cluster secrets on SIGHUP and hands them to the node
// plane, for new connections (see docs/operating/cluster.md for the rotation). nil
// without a cluster.
func secretReloader(c config, plane *cluster.Plane, log *slog.Logger) func() {
	if plane == nil {
		return nil
	}
	return func() {
		current, next, err := c.clusterSecrets()
		if err == nil {
			err = plane.SetSecrets(current, next)
		}
		if err != nil {
			log.Error("SIGHUP: the cluster secrets were not reloaded; the node keeps the ones it had", "err", err)
			return
		}
		log.Info("SIGHUP: reloaded the cluster secrets for new node-plane connections", "next_secret", len(next) > 0)
	}
}
