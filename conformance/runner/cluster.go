package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// The cluster tier: scenarios against a cluster of three or more nodes, with one
// endpoint per node (so the client's failover and lease affinity meet real nodes), that
// may kill the node leading a partition in the middle of a run. A run kills and
// restarts shared nodes, so cluster scenarios run one at a time, after every other
// scenario of the run on that cluster is done, and the runner brings every killed node
// back before the next one starts.

// ErrNoLeader means no running node named a running leader of a partition in time.
var ErrNoLeader = errors.New("no running leader")

// PartitionLeader returns the node id that a's node names as the leader of partition
// p of topic ("" when it names none).
func (a *Admin) PartitionLeader(ctx context.Context, topic string, p int) (string, error) {
	var d struct {
		PartitionStats []struct {
			Partition int    `json:"partition"`
			Leader    string `json:"leader"`
		} `json:"partition_stats"`
	}
	if _, err := a.do(ctx, http.MethodGet, "/v1/topics/"+url.PathEscape(topic), nil, "", nil, &d); err != nil {
		return "", err
	}
	for _, ps := range d.PartitionStats {
		if ps.Partition == p {
			return ps.Leader, nil
		}
	}
	return "", fmt.Errorf("topic %s has no partition %d", topic, p)
}

// createTopic creates a scenario's topic on a cluster. Just after a node came back the
// control plane may answer 503 for a moment: the create is tried again for a while,
// and a 409 after a 503 is the earlier try's topic (the name is this run's own).
func (r *run) createTopic(ctx context.Context, spec TopicSpec) error {
	deadline := time.Now().Add(30 * time.Second)
	unsure := false
	for {
		status, err := r.admin().do(ctx, http.MethodPost, "/v1/topics", nil, "application/json", topicBody(spec), nil)
		switch {
		case err == nil, status == http.StatusConflict && unsure:
			return nil
		case status != http.StatusServiceUnavailable || time.Now().After(deadline):
			return err
		}
		unsure = true
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// admin is the runner's own client: the behaviour tier's broker, or in a cluster the
// first node that is running (a killed node answers nothing).
func (r *run) admin() *Admin {
	for i, n := range r.env.Nodes {
		if n.Running() && r.bg[i] == nil {
			return n.Admin
		}
	}
	return r.env.Broker.Admin
}

// nodeIndex returns the index of the node with id, or -1.
func (r *run) nodeIndex(id string) int {
	for i, n := range r.env.Nodes {
		if n.ID == id {
			return i
		}
	}
	return -1
}

// leaderOf waits until partition p of topic has a leader that is running and says so
// itself (a follower's view may be stale right after a kill), and returns its index.
// A node index in not (-1: none) is not accepted: the one just killed.
func (r *run) leaderOf(ctx context.Context, topic string, p, not int, within time.Duration) (int, error) {
	deadline := time.Now().Add(within)
	var last string
	for {
		for _, n := range r.env.Nodes {
			if !n.Running() {
				continue
			}
			id, err := n.Admin.PartitionLeader(ctx, topic, p)
			if err != nil {
				last = err.Error()
				continue
			}
			i := r.nodeIndex(id)
			if i < 0 || i == not || !r.env.Nodes[i].Running() {
				last = fmt.Sprintf("%s names leader %q", n.ID, id)
				continue
			}
			if self, err := r.env.Nodes[i].Admin.PartitionLeader(ctx, topic, p); err == nil && self == id {
				return i, nil
			}
			last = fmt.Sprintf("%s names leader %s, which does not", n.ID, id)
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("%w of %s partition %d within %v (last: %s)", ErrNoLeader, topic, p, within, last)
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return -1, ctx.Err()
		}
	}
}

// clusterFronts starts one endpoint per node, each sending to its own node only, and
// returns their URLs in the order the scenario asks for.
func (r *run) clusterFronts(ctx context.Context) ([]any, error) {
	r.nodeFront = map[int]*Front{}
	r.bg = map[int]chan error{}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	for i, n := range r.env.Nodes {
		f := &Front{Node: i, History: r.hist, Rules: r.rules,
			Upstream: &ReverseProxy{Base: n.URL, Client: &http.Client{Transport: tr}}}
		if err := f.Start(); err != nil {
			return nil, err
		}
		r.fronts = append(r.fronts, f)
		r.nodeFront[i] = f
		r.cleanup = append(r.cleanup, f.Close)
	}
	first := 0
	if pick := r.sc.FirstEndpoint; pick != nil {
		i, err := r.pickNode(ctx, *pick)
		if err != nil {
			return nil, fmt.Errorf("first_endpoint: %w", err)
		}
		first = i
	}
	var out []any
	for k := range r.env.Nodes {
		out = append(out, r.nodeFront[(first+k)%len(r.env.Nodes)].URL())
	}
	return out, nil
}

// pickNode resolves a NodePick to a node index.
func (r *run) pickNode(ctx context.Context, pick NodePick) (int, error) {
	ref := pick.LeaderOf
	if ref == nil {
		ref = pick.FollowerOf
	}
	if ref == nil {
		return -1, errors.New("want leader_of or follower_of")
	}
	topic, err := r.topicName(ref.Topic)
	if err != nil {
		return -1, err
	}
	lead, err := r.leaderOf(ctx, topic, ref.Partition, -1, 30*time.Second)
	if err != nil || pick.LeaderOf != nil {
		return lead, err
	}
	for i, n := range r.env.Nodes {
		if i != lead && n.Running() {
			return i, nil
		}
	}
	return -1, fmt.Errorf("no running node but the leader of %s partition %d", topic, ref.Partition)
}

// topicName expands a topic reference: a scenario topic's short name or ${name}.
func (r *run) topicName(ref string) (string, error) {
	if full, ok := r.vars[ref].(string); ok {
		return full, nil
	}
	v, err := Expand(ref, r.vars)
	if err != nil {
		return "", err
	}
	s, _ := v.(string)
	if s == "" {
		return "", fmt.Errorf("no topic %q", ref)
	}
	return s, nil
}

// clusterAction runs cluster.kill, cluster.restart and cluster.await_leader.
//
//	cluster.kill: {leader_of: {topic, partition}} | {follower_of: ...}  → {node, index}
//	    kill -9 of that node, and its endpoint closes (refused connections from then on)
//	cluster.restart: {wait: true}  → {nodes: [ids]}
//	    every killed node starts again (same address and data) and its endpoint reopens
//	    once it is ready; wait false returns at once and the restart goes on beside
//	    the steps (a restarted node may take seconds to be ready), finished by the
//	    runner at the end of the scenario at the latest
//	cluster.await_leader: {topic, partition, timeout_ms}  → {node, index}
//	    until a running node leads the partition and says so
func (r *run) clusterAction(ctx context.Context, action string, args map[string]any) (any, error) {
	if len(r.env.Nodes) < 3 || r.nodeFront == nil {
		return nil, errors.New(action + " needs the cluster tier")
	}
	switch action {
	case "cluster.kill":
		raw, _ := json.Marshal(args)
		var pick NodePick
		if err := json.Unmarshal(raw, &pick); err != nil {
			return nil, err
		}
		i, err := r.pickNode(ctx, pick)
		if err != nil {
			return nil, err
		}
		n := r.env.Nodes[i]
		n.Kill()
		r.nodeFront[i].Close()
		r.logf("killed node %s (%s)", n.ID, n.URL)
		return map[string]any{"node": n.ID, "index": float64(i)}, nil
	case "cluster.restart":
		if wait, ok := args["wait"].(bool); ok && !wait {
			var ids []any
			for i, n := range r.env.Nodes {
				if n.Running() || r.bg[i] != nil {
					continue
				}
				ch := make(chan error, 1)
				r.bg[i] = ch
				ids = append(ids, n.ID)
				go func() { ch <- r.restartNode(context.WithoutCancel(ctx), i) }()
			}
			return map[string]any{"nodes": ids}, nil
		}
		ids, err := r.restartKilled(ctx)
		if err != nil {
			return nil, err
		}
		out := make([]any, len(ids))
		for k, id := range ids {
			out[k] = id
		}
		return map[string]any{"nodes": out}, nil
	case "cluster.await_leader":
		topic, err := r.topicName(fmt.Sprint(args["topic"]))
		if err != nil {
			return nil, err
		}
		p, _ := args["partition"].(float64)
		within := 20 * time.Second
		if ms, ok := args["timeout_ms"].(float64); ok {
			within = time.Duration(ms) * time.Millisecond
		}
		i, err := r.leaderOf(ctx, topic, int(p), -1, within)
		if err != nil {
			return nil, err
		}
		return map[string]any{"node": r.env.Nodes[i].ID, "index": float64(i)}, nil
	}
	return nil, fmt.Errorf("unknown action %q", action)
}

// restartKilled finishes the restarts going on in the background, then starts every
// node that is still not running, and reopens their endpoints.
func (r *run) restartKilled(ctx context.Context) ([]string, error) {
	var ids []string
	for i, ch := range r.bg {
		delete(r.bg, i)
		if err := <-ch; err != nil {
			return ids, err
		}
		ids = append(ids, r.env.Nodes[i].ID)
		r.logf("node %s restarted in the background is ready", r.env.Nodes[i].ID)
	}
	for i, n := range r.env.Nodes {
		if n.Running() {
			continue
		}
		if err := r.restartNode(ctx, i); err != nil {
			return ids, err
		}
		ids = append(ids, n.ID)
		r.logf("restarted node %s", n.ID)
	}
	return ids, nil
}

// restartNode starts node i again, waits until it is ready and reopens its endpoint.
// It does not touch the run's log (it may run in the background).
func (r *run) restartNode(ctx context.Context, i int) error {
	n := r.env.Nodes[i]
	if err := n.Restart(ctx); err != nil {
		return fmt.Errorf("restarting %s: %w", n.ID, err)
	}
	if f := r.nodeFront[i]; f != nil {
		if err := f.Reopen(); err != nil {
			return fmt.Errorf("reopening the endpoint of %s: %w", n.ID, err)
		}
	}
	return nil
}

// restoreCluster brings back every killed node and waits until each node sees every
// member alive, so the next scenario's topics get all their replicas.
func (r *run) restoreCluster(ctx context.Context) error {
	if _, err := r.restartKilled(ctx); err != nil {
		return err
	}
	return WaitClusterAlive(ctx, r.env.Nodes, 60*time.Second)
}

// WaitClusterAlive waits until every node is ready and answers /v1/cluster naming the
// same controller, with every node a member whose status is alive.
func WaitClusterAlive(ctx context.Context, nodes []*Broker, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last string
	for {
		ok := true
		controller := ""
		for _, n := range nodes {
			if _, err := n.Admin.do(ctx, http.MethodGet, "/readyz", nil, "", nil, nil); err != nil {
				ok, last = false, n.ID+" is not ready: "+err.Error()
				break
			}
			var c struct {
				Controller string `json:"controller"`
				Members    []struct {
					ID     string `json:"id"`
					Status string `json:"status"`
				} `json:"members"`
			}
			if _, err := n.Admin.do(ctx, http.MethodGet, "/v1/cluster", nil, "", nil, &c); err != nil {
				ok, last = false, err.Error()
				break
			}
			alive := 0
			for _, m := range c.Members {
				if m.Status == "alive" {
					alive++
				}
			}
			if alive < len(nodes) {
				ok, last = false, fmt.Sprintf("%s sees %d of %d members alive", n.ID, alive, len(nodes))
				break
			}
			if c.Controller == "" || (controller != "" && c.Controller != controller) {
				ok, last = false, fmt.Sprintf("%s names controller %q, another %q", n.ID, c.Controller, controller)
				break
			}
			controller = c.Controller
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the cluster was not whole within %v: %s", within, last)
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
