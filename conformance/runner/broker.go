package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	"sync"
	"syscall"
	"time"
)

// Broker is a narad process the runner started for the behaviour tier: single node,
// security on (an admin password), on a free loopback port with a temporary data dir.
type Broker struct {
	URL   string
	Admin *Admin
	// ID is the node id of a cluster member ("c1"); empty for a single node.
	ID string

	// bin, args and env are how the process was started, so Restart starts it again
	// the same way: same address, data directory and cluster identity.
	bin  string
	args []string
	env  []string

	log *capBuffer

	// mu guards the process, which Restart may replace from another goroutine (a
	// restart in the background).
	mu        sync.Mutex
	cmd       *exec.Cmd
	exited    chan struct{}
	discarded bool
}

// errDiscarded means the node was discarded while it was starting.
var errDiscarded = errors.New("the node was discarded")

func (b *Broker) proc() (*exec.Cmd, chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cmd, b.exited
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
		b, err := startBroker(ctx, bin, dataDir, "", nil, nil)
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
	// Every port is held until all are picked: a port closed at once can be the
	// kernel's next answer, and --peers naming one address twice fails the start.
	held := make([]net.PacketConn, 0, n)
	for i := range n {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			for _, c := range held {
				_ = c.Close() // only held to pick distinct ports
			}
			return nil, err
		}
		held = append(held, pc)
		addrs[i] = pc.LocalAddr().String()
		peers[i] = fmt.Sprintf("c%d@%s", i+1, addrs[i])
	}
	for _, c := range held {
		_ = c.Close() // only held to pick distinct ports
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
			b, err := startBroker(ctx, bin, filepath.Join(dir, fmt.Sprintf("c%d", i+1)), "", args, []string{"NARAD_CLUSTER_SECRET=" + clusterSecret})
			if b != nil {
				b.ID = fmt.Sprintf("c%d", i+1)
			}
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
	if firstErr == nil {
		firstErr = bs[0].Admin.waitClusterVersion(ctx)
	}
	if firstErr != nil {
		for _, b := range bs {
			b.Stop()
		}
		return nil, firstErr
	}
	return bs, nil
}

// waitClusterVersion waits until the cluster committed the highest version every
// member speaks: a fresh cluster runs version 1 until its controller has heard every
// member (about a second), and features of later versions (the commit of each
// delivery that keeps delivery_attempt counting across a change of leader) are off
// until then.
func (a *Admin) waitClusterVersion(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var c struct {
		Version int `json:"version"`
		Members []struct {
			MaxVersion int `json:"max_version"`
		} `json:"members"`
	}
	for {
		if status, err := a.do(ctx, http.MethodGet, "/v1/cluster", nil, "", nil, &c); err == nil && status == http.StatusOK && len(c.Members) > 0 {
			want := c.Members[0].MaxVersion
			for _, m := range c.Members {
				want = min(want, m.MaxVersion)
			}
			if c.Version >= want {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cluster did not commit its version within 30 s (at %d)", c.Version)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startBroker starts bin on addr (a free loopback port when empty) and waits until it
// is ready.
func startBroker(ctx context.Context, bin, dataDir, addr string, extra, env []string) (*Broker, error) {
	if addr == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addr = ln.Addr().String()
		_ = ln.Close()
	}
	args := append([]string{"serve", "--http-addr", addr, "--data-dir", dataDir,
		"--auth-failure-delay", "0s", "--log-level", "warn", "--shutdown-grace", "2s"}, extra...)
	b := &Broker{URL: "http://" + addr, bin: bin, args: args, env: env, log: &capBuffer{max: 64 << 10}}
	b.Admin = &Admin{Base: b.URL, Client: &http.Client{Timeout: 30 * time.Second}}
	if err := b.launch(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

// launch starts the process as recorded in b and waits until /readyz answers 200.
func (b *Broker) launch(ctx context.Context) error {
	exited := make(chan struct{})
	cmd := exec.Command(b.bin, b.args...)
	cmd.Env = append(append(os.Environ(), "NARAD_ADMIN_PASSWORD="+AdminPassword), b.env...)
	cmd.Stdout, cmd.Stderr = b.log, b.log
	dieWithRunner(cmd)
	if err := cmd.Start(); err != nil {
		return err
	}
	b.mu.Lock()
	if b.discarded {
		b.mu.Unlock()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return errDiscarded
	}
	b.cmd, b.exited = cmd, exited
	b.mu.Unlock()
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("narad exited before it was ready: %s", b.log.String())
		case <-ctx.Done():
			b.Stop()
			return ctx.Err()
		default:
		}
		resp, err := http.Get(b.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			b.Stop()
			return fmt.Errorf("narad was not ready within 60 s: %s", b.log.String())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// Running reports whether the process is up (started and not exited).
func (b *Broker) Running() bool {
	cmd, exited := b.proc()
	if cmd == nil || cmd.Process == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// Kill ends the process with SIGKILL, as a crash or a power cut would, and waits until
// it is gone.
func (b *Broker) Kill() {
	if !b.Running() {
		return
	}
	cmd, exited := b.proc()
	_ = cmd.Process.Kill()
	<-exited
}

// Discard kills the node for good (SIGKILL): a cluster the runner throws away after
// one scenario. A restart going on in the background ends with it.
func (b *Broker) Discard() {
	b.mu.Lock()
	b.discarded = true
	b.mu.Unlock()
	b.Kill()
}

// Restart starts a killed (or stopped) node again with its address, data directory and
// cluster identity, and waits until it is ready. A running node is left alone.
func (b *Broker) Restart(ctx context.Context) error {
	if b.Running() {
		return nil
	}
	return b.launch(ctx)
}

// Stop ends the broker: SIGTERM, then SIGKILL after 10 s.
func (b *Broker) Stop() {
	if !b.Running() {
		return
	}
	cmd, exited := b.proc()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
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
	_, err := a.do(ctx, http.MethodPost, "/v1/topics", nil, "application/json", topicBody(t), nil)
	return err
}

// topicBody is the create request for t.
func topicBody(t TopicSpec) []byte {
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
	return body
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
