package narad

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/narad-mq/narad/sdk-go/api"
)

// clusterView is what one endpoint says about its cluster (GET /v1/cluster). It is not
// api.Cluster because it also reads ClusterID, which the broker is to send but
// openapi.yaml does not yet describe; older brokers leave it out.
type clusterView struct {
	ClusterID string `json:"cluster_id"`
	NodeID    string `json:"node_id"`
	Members   []struct {
		ID string `json:"id"`
	} `json:"members"`
}

// startClusterCheck runs the one-cluster check in the background, once per client. It
// never delays or fails a call: a client given the endpoints of independent nodes keeps
// working (calls stick to one node, leases are settled where they were issued), but the
// user is told, because messages then land on whichever node is preferred at the time.
func (c *Client) startClusterCheck() {
	c.probeMu.Lock()
	defer c.probeMu.Unlock()
	if c.closed.Load() {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), min(c.cfg.timeout, 10*time.Second))
		defer cancel()
		go func() {
			select {
			case <-c.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		views := make([]*clusterView, len(c.nodes))
		done := make(chan struct{}, len(c.nodes))
		for i, n := range c.nodes {
			go func() {
				defer func() { done <- struct{}{} }()
				views[i] = c.askCluster(ctx, n)
			}()
		}
		for range c.nodes {
			<-done
		}
		if !oneCluster(views) {
			ids := make([]string, 0, len(views))
			for i, v := range views {
				if v != nil {
					ids = append(ids, c.nodes[i].base+"="+v.NodeID)
				}
			}
			c.log.Warn("narad: the endpoints are not one cluster; calls go to the first healthy endpoint and fail over to the others, so messages may land on different nodes",
				"nodes", ids)
		}
	}()
}

// askCluster returns n's answer to GET /v1/cluster, or nil when there is none usable.
func (c *Client) askCluster(ctx context.Context, n *node) *clusterView {
	req, err := api.NewGetClusterRequest(server(n))
	if err != nil {
		return nil
	}
	req = req.WithContext(ctx)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.cfg.userAgent)
	if c.cfg.auth {
		req.SetBasicAuth(c.cfg.user, c.cfg.password)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil
	}
	var v clusterView
	if json.Unmarshal(data, &v) != nil || v.NodeID == "" {
		return nil
	}
	return &v
}

// oneCluster decides from the answers (nil: no answer) whether the endpoints are one
// cluster. With fewer than two answers there is nothing to compare, and that is not a
// reason to warn. When every answer carries a cluster id, they must all be the same;
// otherwise every answering node must be a member in every other answer.
func oneCluster(views []*clusterView) bool {
	var got []*clusterView
	for _, v := range views {
		if v != nil {
			got = append(got, v)
		}
	}
	if len(got) < 2 {
		return true
	}
	allIDs := true
	for _, v := range got {
		if v.ClusterID == "" {
			allIDs = false
		}
	}
	if allIDs {
		for _, v := range got[1:] {
			if v.ClusterID != got[0].ClusterID {
				return false
			}
		}
		return true
	}
	for _, v := range got {
		for _, w := range got {
			if v == w || v.NodeID == w.NodeID {
				continue
			}
			member := false
			for _, m := range w.Members {
				if m.ID == v.NodeID {
					member = true
					break
				}
			}
			if !member {
				return false
			}
		}
	}
	return true
}
