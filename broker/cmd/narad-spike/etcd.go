package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/narad-mq/narad/broker/internal/raftetcd"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/transport"
)

// runEtcd is the spike's second engine: the same groups, HTTP surface and counting
// state machine, on etcd-io/raft through raftetcd. Raft ids are the 1-based positions
// in --peers, which every node gets in the same order.
func runEtcd(c config) error {
	if c.id == "" || c.dataDir == "" || c.peers == "" {
		return errors.New("--id, --data-dir and --peers are required")
	}
	peers := map[uint64]string{}
	var self uint64
	for i, p := range strings.Split(c.peers, ",") {
		id, addr, ok := strings.Cut(p, "=")
		if !ok {
			return fmt.Errorf("--peers: %q is not id=addr", p)
		}
		peers[uint64(i+1)] = addr
		if id == c.id {
			self = uint64(i + 1)
		}
	}
	if self == 0 {
		return fmt.Errorf("--peers lacks --id %q", c.id)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	node, err := transport.New(transport.Options{NodeID: c.id, ListenAddr: c.raftAddr, Secret: []byte(c.secret), Logger: log})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.dataDir, 0o755); err != nil {
		return err
	}
	fss, err := vfs.NewFSSyncer(c.dataDir)
	if err != nil {
		return err
	}
	sg := vfs.NewSyncGroup(fss)
	defer sg.Close()
	fsms := make(map[string]*countFSM, c.groups)
	ids := make([]string, c.groups)
	for i := range ids {
		ids[i] = fmt.Sprintf("p%04d", i)
		fsms[ids[i]] = &countFSM{}
	}
	host, err := raftetcd.New(raftetcd.Options{Node: node, ID: self, Peers: peers, Dir: c.dataDir, Sync: sg,
		Tick: c.tick, ElectionTick: c.electionTick, HeartbeatTick: c.heartbeatTick, NoQuiesce: c.noQuiesce, LazyHeartbeats: c.lazyHeartbeats, Logger: log, Store: c.store, ParallelAppend: c.parallelAppend,
		Apply: func(g string, _ uint64, data []byte) { fsms[g].count(data) }})
	if err != nil {
		return err
	}
	if err := node.Start(); err != nil {
		return err
	}
	defer func() { _ = node.Close() }() // a spike process ends here; nothing to report
	defer host.Close()
	for _, id := range ids {
		if err := host.AddGroup(id); err != nil {
			return err
		}
	}

	ln, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: etcdHandler(ids, host), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	return nil
}

// etcdHandler serves the same surface as handler (see there) on a raftetcd host;
// /status also counts the quiesced groups.
func etcdHandler(ids []string, host *raftetcd.Host) http.Handler {
	known := make(map[string]bool, len(ids))
	for _, id := range ids {
		known[id] = true
	}
	mx := http.NewServeMux()
	mx.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		st := struct {
			Groups     int            `json:"groups"`
			WithLeader int            `json:"with_leader"`
			Quiesced   int            `json:"quiesced"`
			Leading    []string       `json:"leading"`
			Raftnet    raftetcd.Stats `json:"raftnet"`
		}{Groups: len(ids), Raftnet: host.Stats(), Leading: []string{}}
		for _, id := range ids {
			info, _ := host.Info(id)
			if info.Lead != 0 {
				st.WithLeader++
			}
			if info.Leader {
				st.Leading = append(st.Leading, id)
			}
			if info.Quiesced {
				st.Quiesced++
			}
		}
		_ = json.NewEncoder(w).Encode(st)
	})
	apply := func(kind byte) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			g := r.PathValue("group")
			if !known[g] {
				http.Error(w, "no such group", http.StatusNotFound)
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
			ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
			defer cancel()
			idx, err := host.Propose(ctx, g, entryData(kind, n, body))
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprintf(w, "%d\n", idx)
		}
	}
	mx.Handle("/debug/pprof/", http.DefaultServeMux)
	mx.HandleFunc("POST /p/{group}", apply('p'))
	mx.HandleFunc("POST /b/{group}", apply('b'))
	mx.HandleFunc("POST /a/{group}", apply('a'))
	return mx
}
