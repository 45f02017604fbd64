package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Broker is a narad process the runner started for the behaviour tier: single node,
// security on (an admin password), on a free loopback port with a temporary data dir.
type Broker struct {
	URL   string
	Admin *Admin

	cmd    *exec.Cmd
	exited chan struct{}
	log    *capBuffer
}

// AdminUser and AdminPassword are the behaviour tier broker's seeded admin.
const (
	AdminUser     = "admin"
	AdminPassword = "conformance-admin-pw"
)

// StartBroker starts bin serving from dataDir and waits until /readyz answers 200.
func StartBroker(ctx context.Context, bin, dataDir string) (*Broker, error) {
	var lastErr error
	for try := 0; try < 3; try++ {
		b, err := startBroker(ctx, bin, dataDir, nil, nil)
		if err == nil {
			return b, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// clusterSecret is the node-plane secret of the runner's clusters.
const clusterSecret = "conformance-cluster-secret-0123"

// StartCluster starts n nodes of one cluster (bootstrapped from a --peers list), each
// with its own data directory under dir, and waits until every one is ready. The first
// is the one whose Admin the runner uses; requests are spread over all of them.
func StartCluster(ctx context.Context, bin, dir string, n int) ([]*Broker, error) {
	addrs := make([]string, n)
	peers := make([]string, n)
	for i := range n {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addrs[i] = pc.LocalAddr().String()
		_ = pc.Close()
		peers[i] = fmt.Sprintf("c%d@%s", i+1, addrs[i])
	}
	type started struct {
		b   *Broker
		err error
	}
	out := make([]chan started, n)
	for i := range n {
		out[i] = make(chan started, 1)
		go func() {
			// All must start at once: a node waits for the others to form the cluster.
			args := []string{"--node-id", fmt.Sprintf("c%d", i+1), "--cluster-addr", addrs[i], "--peers", strings.Join(peers, ",")}
			b, err := startBroker(ctx, bin, filepath.Join(dir, fmt.Sprintf("c%d", i+1)), args, []string{"NARAD_CLUSTER_SECRET=" + clusterSecret})
			out[i] <- started{b, err}
		}()
	}
	var bs []*Broker
	var firstErr error
	for i := range n {
		s := <-out[i]
		if s.err != nil && firstErr == nil {
			firstErr = fmt.Errorf("node %d: %w", i+1, s.err)
		}
		if s.b != nil {
			bs = append(bs, s.b)
		}
	}
	if firstErr != nil {
		for _, b := range bs {
			b.Stop()
		}
		return nil, firstErr
	}
	return bs, nil
}

func startBroker(ctx context.Context, bin, dataDir string, extra, env []string) (*Broker, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	b := &Broker{URL: "http://" + addr, exited: make(chan struct{}), log: &capBuffer{max: 64 << 10}}
	args := append([]string{"serve", "--http-addr", addr, "--data-dir", dataDir,
		"--auth-failure-delay", "0s", "--log-level", "warn", "--shutdown-grace", "2s"}, extra...)
	b.cmd = exec.Command(bin, args...)
	b.cmd.Env = append(append(os.Environ(), "NARAD_ADMIN_PASSWORD="+AdminPassword), env...)
	b.cmd.Stdout, b.cmd.Stderr = b.log, b.log
	dieWithRunner(b.cmd)
	if err := b.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = b.cmd.Wait(); close(b.exited) }()
	b.Admin = &Admin{Base: b.URL, Client: &http.Client{Timeout: 30 * time.Second}}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-b.exited:
			return nil, fmt.Errorf("narad exited before it was ready: %s", b.log.String())
		case <-ctx.Done():
			b.Stop()
			return nil, ctx.Err()
		default:
		}
		resp, err := http.Get(b.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return b, nil
			}
		}
		if time.Now().After(deadline) {
			b.Stop()
			return nil, fmt.Errorf("narad was not ready within 60 s: %s", b.log.String())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// Stop ends the broker: SIGTERM, then SIGKILL after 10 s.
func (b *Broker) Stop() {
	if b.cmd.Process == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
}

// Log returns the tail of the broker's output.
func (b *Broker) Log() string { return b.log.String() }

// Admin is the runner's own plain-HTTP client of the broker, used to set scenarios up
// and to look at the truth behind an SDK's back (never through the fault proxy).
type Admin struct {
	Base   string
	Client *http.Client
}

func (a *Admin) do(ctx context.Context, method, path string, q url.Values, ctype string, body []byte, out any) (int, error) {
	u := a.Base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.SetBasicAuth(AdminUser, AdminPassword)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := a.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out != nil && len(data) > 0 {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}

// CreateTopic creates a topic.
func (a *Admin) CreateTopic(ctx context.Context, t TopicSpec) error {
	req := map[string]any{"name": t.Name, "partitions": max(t.Partitions, 1)}
	if t.VisibilityTimeout > 0 {
		req["visibility_timeout_ms"] = t.VisibilityTimeout
	}
	if t.Retention > 0 {
		req["retention_ms"] = t.Retention
	}
	if t.Schema != nil {
		req["schema"] = t.Schema
	}
	body, _ := json.Marshal(req)
	_, err := a.do(ctx, http.MethodPost, "/v1/topics", nil, "application/json", body, nil)
	return err
}

// DeleteTopic deletes a topic.
func (a *Admin) DeleteTopic(ctx context.Context, name string) error {
	_, err := a.do(ctx, http.MethodDelete, "/v1/topics/"+url.PathEscape(name), nil, "", nil, nil)
	return err
}

// CreateUser creates a user with grants.
func (a *Admin) CreateUser(ctx context.Context, args map[string]any) error {
	body, _ := json.Marshal(args)
	_, err := a.do(ctx, http.MethodPost, "/v1/users", nil, "application/json", body, nil)
	return err
}

// Produce writes one message with the given content type.
func (a *Admin) Produce(ctx context.Context, topic string, body []byte, ctype string, q url.Values) (map[string]any, error) {
	var out map[string]any
	_, err := a.do(ctx, http.MethodPost, "/v1/topics/"+url.PathEscape(topic)+"/produce", q, ctype, body, &out)
	return out, err
}

// Topic returns the topic's detail.
func (a *Admin) Topic(ctx context.Context, name string) (map[string]any, error) {
	var out map[string]any
	_, err := a.do(ctx, http.MethodGet, "/v1/topics/"+url.PathEscape(name), nil, "", nil, &out)
	return out, err
}

// ReadAll reads every retained message of every partition, in log order per partition,
// partitions in turn, without leases.
func (a *Admin) ReadAll(ctx context.Context, name string) ([]any, error) {
	info, err := a.Topic(ctx, name)
	if err != nil {
		return nil, err
	}
	n, _ := strconv.Atoi(fmt.Sprint(info["partitions"]))
	var out []any
	for p := 0; p < n; p++ {
		from := int64(0)
		for {
			var page struct {
				Messages   []map[string]any `json:"messages"`
				NextOffset json.Number      `json:"next_offset"`
			}
			q := url.Values{"from": {strconv.FormatInt(from, 10)}, "max": {"1000"}, "payload_encoding": {"base64"}}
			if _, err := a.do(ctx, http.MethodGet, fmt.Sprintf("/v1/topics/%s/partitions/%d/messages", url.PathEscape(name), p), q, "", nil, &page); err != nil {
				return nil, err
			}
			for _, m := range page.Messages {
				out = append(out, map[string]any{"partition": m["partition"], "offset": m["offset"], "key": m["key"], "body_b64": m["payload"]})
			}
			next, _ := page.NextOffset.Int64()
			if len(page.Messages) == 0 || next <= from {
				break
			}
			from = next
		}
	}
	return decorate(normalize(out)).([]any), nil
}
