// Command narad-spike is the replication spike's node: one process hosting N raft
// groups (one per partition) over the node plane, with the raftnet transport and the
// raftlog store, and a tiny HTTP surface the measurement harness
// (bench/cmd/narad-raft-bench) drives. It is a measurement prototype, not the
// product: the state machine only counts. See docs/internals/replication.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // on the harness port, for profiling the spike
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/raftlog"
	"github.com/narad-mq/narad/broker/internal/raftnet"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/transport"
)

type config struct {
	id, raftAddr, httpAddr, dataDir, peers, secret string
	groups                                         int
	heartbeat, election, lease, commit, tick       time.Duration
	maxAppend                                      int
	engine                                         string
	store                                          string
	parallelAppend                                 bool
	electionTick                                   int
	noQuiesce, lazyHeartbeats                      bool
	heartbeatTick                                  int
}

func main() {
	var c config
	flag.StringVar(&c.id, "id", "", "node id (n1, n2, …)")
	flag.StringVar(&c.raftAddr, "raft-addr", "127.0.0.1:0", "UDP host:port of the node plane")
	flag.StringVar(&c.httpAddr, "http-addr", "127.0.0.1:0", "HTTP host:port for the harness")
	flag.StringVar(&c.dataDir, "data-dir", "", "data directory")
	flag.StringVar(&c.peers, "peers", "", "every voter as id=udp-addr, comma-separated, this node included")
	flag.StringVar(&c.secret, "secret", "narad-spike-cluster-secret-0001", "cluster secret")
	flag.IntVar(&c.groups, "groups", 300, "raft groups (partitions) hosted, each on every peer")
	flag.DurationVar(&c.heartbeat, "heartbeat-timeout", time.Second, "raft HeartbeatTimeout")
	flag.DurationVar(&c.election, "election-timeout", time.Second, "raft ElectionTimeout")
	flag.DurationVar(&c.lease, "lease-timeout", 750*time.Millisecond, "raft LeaderLeaseTimeout")
	flag.DurationVar(&c.commit, "commit-timeout", time.Second, "raft CommitTimeout")
	flag.DurationVar(&c.tick, "tick", 100*time.Millisecond, "raftnet batching tick")
	flag.IntVar(&c.maxAppend, "max-append", 512, "raft MaxAppendEntries")
	flag.StringVar(&c.engine, "engine", "hashicorp", "raft engine: hashicorp (raftnet + raftlog) or etcd (raftetcd)")
	flag.IntVar(&c.electionTick, "election-tick", 10, "etcd: election timeout in ticks (--tick each); heartbeats every tick")
	flag.BoolVar(&c.noQuiesce, "no-quiesce", false, "etcd: keep idle groups ticking")
	flag.BoolVar(&c.parallelAppend, "parallel-append", false, "etcd: a leader sends new entries to followers while it writes them itself")
	flag.StringVar(&c.store, "store", "wal", "etcd: the groups' log store: wal (the spike's prototype) or raftstore (the build's)")
	flag.IntVar(&c.heartbeatTick, "heartbeat-tick", 1, "etcd: heartbeat interval in ticks")
	flag.BoolVar(&c.lazyHeartbeats, "lazy-heartbeats", false, "etcd: heartbeats wait for the next tick's frame to a peer")
	procs := flag.Int("procs", 0, "GOMAXPROCS; 0 keeps Go's default")
	flag.Parse()
	if *procs > 0 {
		runtime.GOMAXPROCS(*procs)
	}
	runner := run
	switch c.engine {
	case "hashicorp":
	case "etcd":
		runner = runEtcd
	default:
		fmt.Fprintln(os.Stderr, "narad-spike: --engine must be hashicorp or etcd")
		os.Exit(2)
	}
	if err := runner(c); err != nil {
		fmt.Fprintln(os.Stderr, "narad-spike:", err)
		os.Exit(1)
	}
}

// group is one partition's raft and its counting state machine.
type group struct {
	id  string
	r   *raft.Raft
	fsm *countFSM
}

// countFSM counts applied messages; a batch entry carries its count in its first 4
// bytes' decimal text ("n=100;…"), a single message counts one.
type countFSM struct {
	messages atomic.Int64
	acks     atomic.Int64
}

func (f *countFSM) Apply(l *raft.Log) any { return f.count(l.Data) }

func (f *countFSM) count(data []byte) int64 {
	n := int64(1)
	if len(data) > 2 && (data[0] == 'b' || data[0] == 'a') {
		if i := strings.IndexByte(string(data[:min(len(data), 16)]), ';'); i > 1 {
			if v, err := strconv.Atoi(string(data[1:i])); err == nil {
				n = int64(v)
			}
		}
	}
	if len(data) > 0 && data[0] == 'a' {
		return f.acks.Add(n)
	}
	return f.messages.Add(n)
}

// entryData is what one Apply carries: kind 'p' one message, 'b' a batch of n, 'a' a
// settle of n.
func entryData(kind byte, n int, body []byte) []byte {
	if kind == 'p' {
		return append([]byte{'p'}, body...)
	}
	return append(fmt.Appendf(nil, "%c%d;", kind, n), body...)
}

func (f *countFSM) Snapshot() (raft.FSMSnapshot, error) {
	return nil, errors.New("narad-spike takes no snapshots")
}
func (f *countFSM) Restore(io.ReadCloser) error { return nil }

func run(c config) error {
	if c.id == "" || c.dataDir == "" || c.peers == "" {
		return errors.New("--id, --data-dir and --peers are required")
	}
	var servers []raft.Server
	for _, p := range strings.Split(c.peers, ",") {
		id, addr, ok := strings.Cut(p, "=")
		if !ok {
			return fmt.Errorf("--peers: %q is not id=addr", p)
		}
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(addr)})
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	node, err := transport.New(transport.Options{NodeID: c.id, ListenAddr: c.raftAddr, Secret: []byte(c.secret), Logger: log})
	if err != nil {
		return err
	}
	mux, err := raftnet.New(raftnet.Options{Node: node, Tick: c.tick, Logger: log})
	if err != nil {
		return err
	}
	if err := node.Start(); err != nil {
		return err
	}
	defer func() { _ = node.Close() }() // a spike process ends here; nothing to report
	defer mux.Close()

	if err := os.MkdirAll(c.dataDir, 0o755); err != nil {
		return err
	}
	fss, err := vfs.NewFSSyncer(c.dataDir)
	if err != nil {
		return err
	}
	sg := vfs.NewSyncGroup(fss)
	defer sg.Close()

	hlog := hclog.New(&hclog.LoggerOptions{Name: c.id, Level: hclog.Error, Output: os.Stderr})
	groups := make([]*group, c.groups)
	for i := range groups {
		id := fmt.Sprintf("p%04d", i)
		conf := raft.DefaultConfig()
		conf.LocalID = raft.ServerID(c.id)
		conf.HeartbeatTimeout = c.heartbeat
		conf.ElectionTimeout = c.election
		conf.LeaderLeaseTimeout = c.lease
		conf.CommitTimeout = c.commit
		conf.MaxAppendEntries = c.maxAppend
		conf.BatchApplyCh = true
		conf.SnapshotThreshold = 1 << 62
		conf.SnapshotInterval = time.Hour
		conf.Logger = hlog.Named(id)
		conf.NoLegacyTelemetry = true
		store, err := raftlog.Open(filepath.Join(c.dataDir, id), sg)
		if err != nil {
			return err
		}
		tr, err := mux.Transport(id)
		if err != nil {
			return err
		}
		snaps := raft.NewDiscardSnapshotStore()
		has, err := raft.HasExistingState(store, store, snaps)
		if err != nil {
			return err
		}
		if !has {
			if err := raft.BootstrapCluster(conf, store, store, snaps, tr, raft.Configuration{Servers: servers}); err != nil {
				return err
			}
		}
		fsm := &countFSM{}
		r, err := raft.NewRaft(conf, fsm, store, store, snaps, tr)
		if err != nil {
			return err
		}
		groups[i] = &group{id: id, r: r, fsm: fsm}
	}

	ln, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler(c, groups, mux), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	for _, g := range groups {
		_ = g.r.Shutdown().Error()
	}
	return nil
}

// handler serves the harness:
//
//	GET  /status        {"groups":N,"with_leader":K,"leading":[ids…],"raftnet":{…}}
//	POST /p/{group}     one message, one Apply: 202 once committed and applied;
//	                    503 when this node is not the group's leader
//	POST /b/{group}?n=K one Apply carrying K messages (the body), same answers
//	POST /a/{group}?n=K one Apply settling K messages (an ack), same answers
func handler(c config, groups []*group, mux *raftnet.Mux) http.Handler {
	byID := make(map[string]*group, len(groups))
	for _, g := range groups {
		byID[g.id] = g
	}
	mx := http.NewServeMux()
	mx.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		st := struct {
			Groups     int           `json:"groups"`
			WithLeader int           `json:"with_leader"`
			Leading    []string      `json:"leading"`
			Raftnet    raftnet.Stats `json:"raftnet"`
		}{Groups: len(groups), Raftnet: mux.Stats(), Leading: []string{}}
		for _, g := range groups {
			if addr, _ := g.r.LeaderWithID(); addr != "" {
				st.WithLeader++
			}
			if g.r.State() == raft.Leader {
				st.Leading = append(st.Leading, g.id)
			}
		}
		_ = json.NewEncoder(w).Encode(st)
	})
	apply := func(kind byte) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			g := byID[r.PathValue("group")]
			if g == nil {
				http.Error(w, "no such group", http.StatusNotFound)
				return
			}
			if g.r.State() != raft.Leader {
				http.Error(w, "not the leader", http.StatusServiceUnavailable)
				return
			}
			body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			n := 1
			if s := r.URL.Query().Get("n"); s != "" {
				if n, err = strconv.Atoi(s); err != nil || n < 1 {
					http.Error(w, "n must be a positive integer", http.StatusBadRequest)
					return
				}
			}
			f := g.r.Apply(entryData(kind, n, body), 5*time.Second)
			if err := f.Error(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprintf(w, "%d\n", f.Index())
		}
	}
	mx.Handle("/debug/pprof/", http.DefaultServeMux)
	mx.HandleFunc("POST /p/{group}", apply('p'))
	mx.HandleFunc("POST /b/{group}", apply('b'))
	mx.HandleFunc("POST /a/{group}", apply('a'))
	return mx
}
