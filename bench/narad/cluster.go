package narad

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/narad-mq/narad/bench/proc"
)

// clusterReadyTimeout bounds the start of a cluster: every node ready and agreeing on
// the members. Nodes start together and elect a controller first, on a machine the
// load generator and other work share.
const clusterReadyTimeout = 90 * time.Second

// placedTimeout bounds the wait for every node to list a new topic with its placement.
const placedTimeout = 30 * time.Second

// LaunchCluster starts n nodes of one cluster on loopback, each with its own data
// directory under dir, a free HTTP port and a free UDP port for its node plane, and a
// cluster secret made for this run. Every node is given the whole --peers list, as
// `make cluster` does. It returns once every node is ready and lists the n members
// alive; the target's goroutines are spread over the nodes round robin and Close
// stops every node. With profileDir, each node also serves Go's profiles on a
// loopback --debug-addr, and each shape's window is profiled on every node (ShapeStarted).
func LaunchCluster(bin, dir string, n, conns int, log io.Writer, profileDir string) (*Target, error) {
	if n < 1 {
		return nil, fmt.Errorf("a cluster needs at least 1 node, not %d", n)
	}
	var key [24]byte
	if _, err := rand.Read(key[:]); err != nil {
		return nil, err
	}
	secret := hex.EncodeToString(key[:])
	t := New("", conns)
	t.name = fmt.Sprintf("narad-%dnodes", n)
	t.bases = nil
	var clusterAddrs, peers []string
	var debugArgs [][]string // --debug-addr when profiling
	for i := range n {
		h, err := proc.FreeAddr()
		if err != nil {
			return nil, err
		}
		c, err := proc.FreeUDPAddr()
		if err != nil {
			return nil, err
		}
		id := fmt.Sprintf("n%d", i+1)
		t.bases = append(t.bases, "http://"+h)
		t.ids = append(t.ids, id)
		clusterAddrs = append(clusterAddrs, c)
		peers = append(peers, id+"@"+c)
		dbg, err := t.withProfiles(nil, profileDir)
		if err != nil {
			return nil, err
		}
		debugArgs = append(debugArgs, dbg)
	}
	t.base = t.bases[0]
	// Every node waits for the others to elect a controller, so they start at once.
	t.nodes = make([]*proc.Process, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		cmd := exec.Command(bin, "serve", "--node-id", t.ids[i],
			"--http-addr", strings.TrimPrefix(t.bases[i], "http://"),
			"--cluster-addr", clusterAddrs[i], "--peers", strings.Join(peers, ","),
			"--data-dir", filepath.Join(dir, t.ids[i]), "--log-level", "warn")
		cmd.Args = append(cmd.Args, debugArgs[i]...)
		cmd.Env = append(os.Environ(), "NARAD_CLUSTER_SECRET="+secret)
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.nodes[i], errs[i] = proc.Start(cmd, log, clusterReadyTimeout, t.ready(t.bases[i]))
		}()
	}
	wg.Wait()
	var started []*proc.Process
	for i, p := range t.nodes {
		if p != nil {
			started = append(started, p)
		}
		if errs[i] != nil {
			errs[i] = fmt.Errorf("starting narad node %s: %w", t.ids[i], errs[i])
		}
	}
	t.nodes = started
	if err := errors.Join(errs...); err != nil {
		_ = t.Close() // stops the nodes that did start
		return nil, err
	}
	if err := t.waitMembers(clusterReadyTimeout); err != nil {
		_ = t.Close()
		return nil, err
	}
	return t, nil
}

// Nodes are the node ids of a cluster, in the order of their HTTP addresses; the
// first is where topics are created. A lone node has none.
func (t *Target) Nodes() []string { return t.ids }

// waitMembers polls GET /v1/cluster on every node until each names a controller and
// lists exactly the cluster's nodes, all alive.
func (t *Target) waitMembers(bound time.Duration) error {
	want := strings.Join(t.ids, ",")
	var last string
	ok := poll(bound, func() bool {
		for _, base := range t.bases {
			var c struct {
				Controller string `json:"controller"`
				Members    []struct {
					ID     string `json:"id"`
					Status string `json:"status"`
				} `json:"members"`
			}
			if err := t.getJSON(base+"/v1/cluster", &c); err != nil {
				last = err.Error()
				return false
			}
			var alive []string
			for _, m := range c.Members {
				if m.Status == "alive" {
					alive = append(alive, m.ID)
				}
			}
			slices.Sort(alive)
			if c.Controller == "" || strings.Join(alive, ",") != want {
				last = fmt.Sprintf("%s: controller %q, alive members %v", base, c.Controller, alive)
				return false
			}
		}
		return true
	})
	if !ok {
		return fmt.Errorf("the cluster did not form within %s: %s", bound, last)
	}
	return nil
}

// Holders returns, per partition of topic, the id of the node that holds it, once
// every node of the cluster lists the topic with the same placement. A lone node
// holds every partition: nil.
func (t *Target) Holders(ctx context.Context, topic string) ([]string, error) {
	if len(t.ids) == 0 {
		return nil, nil
	}
	var holders []string
	var last string
	ok := poll(placedTimeout, func() bool {
		holders = nil
		for _, base := range t.bases {
			var d struct {
				PartitionStats []struct {
					Partition int    `json:"partition"`
					Leader    string `json:"leader"`
				} `json:"partition_stats"`
			}
			if err := t.getJSON(base+"/v1/topics/"+url.PathEscape(topic), &d); err != nil {
				last = err.Error()
				return false
			}
			hs := make([]string, len(d.PartitionStats))
			for _, ps := range d.PartitionStats {
				if ps.Partition < 0 || ps.Partition >= len(hs) || !t.isNode(ps.Leader) {
					last = fmt.Sprintf("%s: partition %d held by %q", base, ps.Partition, ps.Leader)
					return false
				}
				hs[ps.Partition] = ps.Leader
			}
			if len(hs) == 0 || (holders != nil && strings.Join(hs, ",") != strings.Join(holders, ",")) {
				last = fmt.Sprintf("%s: placement %v, another node %v", base, hs, holders)
				return false
			}
			holders = hs
		}
		return ctx.Err() == nil
	})
	if !ok {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("topic %s was not listed placed on every node within %s: %s", topic, placedTimeout, last)
	}
	return holders, nil
}

func (t *Target) isNode(id string) bool {
	for _, n := range t.ids {
		if n == id {
			return true
		}
	}
	return false
}

// getJSON reads a 200 answer of u into v, with a bound of its own.
func (t *Target) getJSON(u string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, body, err := t.do(ctx, http.MethodGet, u, "", nil, nil)
	if err != nil {
		return err
	}
	if st != http.StatusOK {
		return statusError("GET "+u, st, body)
	}
	return json.Unmarshal(body, v)
}

// poll calls cond every 50 ms until it holds or bound passed.
func poll(bound time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(bound)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Counters are the cluster's own counters, summed over its nodes' /metrics (each
// since its node started): what moved partition leaderships (a healthy run under load
// has no liveness lapse and no forced campaign, and wins one leadership per partition
// it creates) and the requests the nodes served each other on the node plane
// (forwarded requests, liveness calls) and the replication frames they sent each other
// as messages on kept streams, and the nodes' shared sync rounds (how many, the files
// they synced, the seconds they took).
type Counters struct {
	LivenessLapses    float64 `json:"liveness_lapses"`
	ForcedCampaigns   float64 `json:"forced_campaigns"`
	LeadershipsWon    float64 `json:"leaderships_won"`
	NodePlaneRequests float64 `json:"node_plane_requests"`
	StreamMessages    float64 `json:"stream_messages"`
	SyncRounds        float64 `json:"sync_rounds"`
	SyncFiles         float64 `json:"sync_files"`
	SyncSeconds       float64 `json:"sync_seconds"`
}

// Sub is c minus an earlier reading.
func (c Counters) Sub(before Counters) Counters {
	return Counters{c.LivenessLapses - before.LivenessLapses, c.ForcedCampaigns - before.ForcedCampaigns,
		c.LeadershipsWon - before.LeadershipsWon, c.NodePlaneRequests - before.NodePlaneRequests,
		c.StreamMessages - before.StreamMessages, c.SyncRounds - before.SyncRounds,
		c.SyncFiles - before.SyncFiles, c.SyncSeconds - before.SyncSeconds}
}

// Counters reads the counters of every node.
func (t *Target) Counters(ctx context.Context) (Counters, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var c Counters
	for _, base := range t.bases {
		st, body, err := t.do(ctx, http.MethodGet, base+"/metrics", "", nil, nil)
		if err != nil {
			return c, err
		}
		if st != http.StatusOK {
			return c, statusError("GET "+base+"/metrics", st, body)
		}
		for _, line := range strings.Split(string(body), "\n") {
			name, rest, ok := strings.Cut(line, " ")
			if !ok || strings.HasPrefix(name, "#") {
				continue
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				continue
			}
			switch name, _, _ = strings.Cut(name, "{"); name {
			case "narad_peer_liveness_lapses_total":
				c.LivenessLapses += v
			case "narad_replication_forced_campaigns_total":
				c.ForcedCampaigns += v
			case "narad_replication_leaderships_won_total":
				c.LeadershipsWon += v
			case "narad_cluster_requests_served_total":
				c.NodePlaneRequests += v
			case "narad_cluster_stream_messages_total":
				c.StreamMessages += v
			case "narad_storage_sync_rounds_total":
				c.SyncRounds += v
			case "narad_storage_sync_files_total":
				c.SyncFiles += v
			case "narad_storage_sync_seconds_total":
				c.SyncSeconds += v
			}
		}
	}
	return c, nil
}
