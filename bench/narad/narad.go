// Package narad is the benchmark's narad target: it starts a node (or uses a running
// one) and drives it over the HTTP API the way a plain HTTP client would, one request
// per operation, with keep-alive connections and per-goroutine buffers.
package narad

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
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
	"sync"
	"sync/atomic"
	"time"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/narad-mq/narad/bench/load"
	"github.com/narad-mq/narad/bench/proc"
)

// readyTimeout bounds the wait for a started node's /readyz.
const readyTimeout = 30 * time.Second

// Target drives one narad node, or the nodes of a cluster (LaunchCluster). It
// implements load.Target, load.Fanouter and load.Processes.
type Target struct {
	name   string
	base   string   // where topics are created and deleted: the first node
	bases  []string // every node; goroutine i of a shape talks to bases[i%len(bases)]
	ids    []string // the node ids of a cluster, as bases; nil for a lone node
	http   *http.Client
	nodes  []*proc.Process // empty when the nodes were not started by Launch or LaunchCluster
	prefix string          // topic names of this run: bench-<prefix>-<n>
	seq    atomic.Int64
	// profileDir, when set, receives a CPU profile of every node over each shape's
	// window, from the node's loopback --debug-addr (debug, as bases).
	profileDir string
	debug      []string
	profiles   sync.WaitGroup
	profMu     sync.Mutex
	profErr    error
	// Counters of a cluster's nodes at the start of the shape running, and what each
	// shape moved (ShapeStarted, ShapeEnded).
	atStart  Counters
	startErr error
	perShape map[string]Counters
}

var (
	_ load.Target    = (*Target)(nil)
	_ load.Fanouter  = (*Target)(nil)
	_ load.Processes = (*Target)(nil)
	_ load.Observer  = (*Target)(nil)
)

// New returns a target for the node at base (e.g. http://127.0.0.1:7942) with a pool
// of conns keep-alive connections; its server is not observed (PID 0).
func New(base string, conns int) *Target {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &Target{
		name:   "narad",
		base:   base,
		bases:  []string{base},
		prefix: hex.EncodeToString(b[:]),
		http: &http.Client{Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        conns,
			MaxIdleConnsPerHost: conns,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
			WriteBufferSize:     64 << 10,
			ReadBufferSize:      64 << 10,
		}},
	}
}

// Launch starts `bin serve` on a free loopback port with dataDir, its output to log,
// waits until it is ready and returns a target whose Close stops it.
func Launch(bin, dataDir string, conns int, log io.Writer, profileDir string) (*Target, error) {
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	t := New("http://"+addr, conns)
	args := []string{"serve", "--http-addr", addr, "--data-dir", dataDir, "--log-level", "warn"}
	if args, err = t.withProfiles(args, profileDir); err != nil {
		return nil, err
	}
	node, err := proc.Start(exec.Command(bin, args...), log, readyTimeout, t.ready(t.base))
	if err != nil {
		return nil, fmt.Errorf("starting narad: %w", err)
	}
	t.nodes = []*proc.Process{node}
	return t, nil
}

// withProfiles adds a free loopback --debug-addr to a node's arguments when profileDir
// is set, and remembers it (in the order the nodes are launched).
func (t *Target) withProfiles(args []string, profileDir string) ([]string, error) {
	if profileDir == "" {
		return args, nil
	}
	if err := os.MkdirAll(profileDir, 0o755); err != nil {
		return nil, err
	}
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	t.profileDir = profileDir
	t.debug = append(t.debug, addr)
	return append(args, "--debug-addr", addr), nil
}

// ShapeStarted (load.Observer) reads a cluster's counters, and fetches a CPU profile
// of every node over the window when profileDir is set: in the background, into
// profileDir as <target>-<shape>-<node>.pprof. Close waits for the profiles and
// reports one that failed.
func (t *Target) ShapeStarted(shape string, window time.Duration) {
	if len(t.ids) > 0 {
		t.atStart, t.startErr = t.Counters(context.Background())
	}
	if t.profileDir == "" {
		return
	}
	secs := max(1, int(window.Round(time.Second)/time.Second))
	for i, addr := range t.debug {
		node := "node"
		if i < len(t.ids) {
			node = t.ids[i]
		}
		path := filepath.Join(t.profileDir, fmt.Sprintf("%s-%s-%s.pprof", t.name, shape, node))
		t.profiles.Add(1)
		go func() {
			defer t.profiles.Done()
			if err := fetchProfile(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs), path, window+30*time.Second); err != nil {
				t.profMu.Lock()
				t.profErr = errors.Join(t.profErr, fmt.Errorf("profile of %s over %s: %w", node, shape, err))
				t.profMu.Unlock()
			}
		}()
	}
}

// ShapeEnded (load.Observer) records what the shape moved on a cluster's counters.
func (t *Target) ShapeEnded(shape string) {
	if len(t.ids) == 0 || t.startErr != nil {
		return
	}
	end, err := t.Counters(context.Background())
	if err != nil {
		return
	}
	if t.perShape == nil {
		t.perShape = map[string]Counters{}
	}
	t.perShape[shape] = end.Sub(t.atStart)
}

// ShapeCounters returns what each shape run on a cluster moved on its nodes' counters
// (a shape whose counters could not be read is missing).
func (t *Target) ShapeCounters() map[string]Counters { return t.perShape }

// fetchProfile writes what u answers to path.
func fetchProfile(u, path string, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }() // read to the end below
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %d: %s", u, resp.StatusCode, body)
	}
	return os.WriteFile(path, body, 0o644)
}

// ready probes the /readyz of the node at base.
func (t *Target) ready(base string) func(context.Context) error {
	return func(ctx context.Context) error {
		st, _, err := t.do(ctx, http.MethodGet, base+"/readyz", "", nil, nil)
		if err == nil && st != http.StatusOK {
			err = fmt.Errorf("readyz: %d", st)
		}
		return err
	}
}

// Name is "narad", or "narad-<N>nodes" for a cluster.
func (t *Target) Name() string { return t.name }

// PID is the (first) node's process when Launch or LaunchCluster started it, else 0.
func (t *Target) PID() int {
	if len(t.nodes) == 0 {
		return 0
	}
	return t.nodes[0].PID()
}

// PIDs are the processes of every node started, so a cluster's CPU and memory are
// added up; a node the run did not start is PID 0 (not observed).
func (t *Target) PIDs() []int {
	if len(t.nodes) == 0 {
		return []int{0}
	}
	out := make([]int, len(t.nodes))
	for i, n := range t.nodes {
		out[i] = n.PID()
	}
	return out
}

// Close stops the nodes Launch or LaunchCluster started, all at once.
func (t *Target) Close() error {
	t.profiles.Wait() // the nodes serve their profiles until the window ends
	t.http.CloseIdleConnections()
	var wg sync.WaitGroup
	for _, n := range t.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.Stop() }()
	}
	wg.Wait()
	t.profMu.Lock()
	defer t.profMu.Unlock()
	return t.profErr
}

// do sends one request and reads the whole answer into buf (a fresh buffer when nil);
// the returned body aliases buf.
func (t *Target) do(ctx context.Context, method, u, ctype string, body []byte, buf *bytes.Buffer) (int, []byte, error) {
	var rd io.Reader = http.NoBody
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := t.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if buf == nil {
		buf = new(bytes.Buffer)
	}
	buf.Reset()
	_, err = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes(), err
}

// statusError describes an unexpected answer with the start of its body.
func statusError(op string, st int, body []byte) error {
	if len(body) > 200 {
		body = body[:200]
	}
	return fmt.Errorf("%s: HTTP %d %s", op, st, bytes.TrimSpace(body))
}

func (t *Target) createTopic(ctx context.Context, partitions int) (string, error) {
	name := fmt.Sprintf("bench-%s-%d", t.prefix, t.seq.Add(1))
	body, _ := json.Marshal(map[string]any{
		"name": name, "partitions": partitions,
		"max_in_flight_per_partition": 100000, "max_acked_ahead_per_partition": 100000,
	})
	st, msg, err := t.do(ctx, http.MethodPost, t.base+"/v1/topics", "application/json", body, nil)
	if err != nil {
		return "", err
	}
	if st != http.StatusCreated {
		return "", statusError("create topic", st, msg)
	}
	return name, nil
}

func (t *Target) deleteTopic(ctx context.Context, name string) error {
	st, msg, err := t.do(ctx, http.MethodDelete, t.base+"/v1/topics/"+name, "", nil, nil)
	if err != nil {
		return err
	}
	if st != http.StatusNoContent {
		return statusError("delete topic", st, msg)
	}
	return nil
}

// Open creates a topic of partitions partitions with in-flight and acked-ahead caps
// high enough that no shape runs into them; on a cluster, once every node lists it
// placed.
func (t *Target) Open(ctx context.Context, partitions int) (load.Queue, error) {
	name, err := t.createTopic(ctx, partitions)
	if err != nil {
		return nil, err
	}
	if _, err := t.Holders(ctx, name); err != nil {
		return nil, err
	}
	return &queue{t: t, topic: name}, nil
}

// OpenFanout creates a parent topic and children topics attached to it; lag sums
// every child's lag over the parent's partitions.
func (t *Target) OpenFanout(ctx context.Context, partitions, children int) (load.Queue, func(context.Context) (int64, int64, error), error) {
	parent, err := t.createTopic(ctx, partitions)
	if err != nil {
		return nil, nil, err
	}
	q := &queue{t: t, topic: parent}
	for i := 0; i < children; i++ {
		child, err := t.createTopic(ctx, partitions)
		if err != nil {
			return nil, nil, err
		}
		q.children = append(q.children, child)
		body, _ := json.Marshal(map[string]any{"child": child})
		st, msg, err := t.do(ctx, http.MethodPost, t.base+"/v1/topics/"+parent+"/children", "application/json", body, nil)
		if err != nil {
			return nil, nil, err
		}
		if st != http.StatusCreated {
			return nil, nil, statusError("attach child", st, msg)
		}
	}
	lag := func(ctx context.Context) (int64, int64, error) {
		st, data, err := t.do(ctx, http.MethodGet, t.base+"/v1/topics/"+parent+"/children", "", nil, nil)
		if err != nil {
			return 0, 0, err
		}
		if st != http.StatusOK {
			return 0, 0, statusError("list children", st, data)
		}
		var l struct {
			Children []struct {
				Lag []struct {
					Lag         int64 `json:"lag"`
					ChildCursor int64 `json:"child_cursor"`
				} `json:"lag"`
			} `json:"children"`
		}
		if err := json.Unmarshal(data, &l); err != nil {
			return 0, 0, err
		}
		var total, copied int64
		for _, c := range l.Children {
			for _, p := range c.Lag {
				total += p.Lag
				copied += p.ChildCursor
			}
		}
		return total, copied, nil
	}
	return q, lag, nil
}

// queue is one topic; every producer and consumer gets its own client with its own
// buffers and prebuilt URLs.
type queue struct {
	t        *Target
	topic    string
	children []string
}

// Goroutine i talks to node i mod nodes: a cluster's clients are spread over its
// nodes round robin, and each node forwards what other nodes hold.
func (q *queue) Producer(i int) load.Producer    { return q.client(i) }
func (q *queue) Consumer(i, _ int) load.Consumer { return q.client(i) }

// Delete detaches and deletes the children, then deletes the topic.
func (q *queue) Delete(ctx context.Context) error {
	var errs []error
	for _, c := range q.children {
		st, msg, err := q.t.do(ctx, http.MethodDelete, q.t.base+"/v1/topics/"+q.topic+"/children/"+c, "", nil, nil)
		if err == nil && st != http.StatusNoContent {
			err = statusError("detach child", st, msg)
		}
		errs = append(errs, err, q.t.deleteTopic(ctx, c))
	}
	errs = append(errs, q.t.deleteTopic(ctx, q.topic))
	return errors.Join(errs...)
}

func (q *queue) client(i int) *client {
	return q.t.clientAt(q.t.bases[i%len(q.t.bases)], q.topic)
}

// clientAt is a client of topic through the node at base.
func (t *Target) clientAt(base, topic string) *client {
	u := base + "/v1/topics/" + url.PathEscape(topic)
	return &client{
		t:          t,
		produce:    u + "/produce",
		batch:      u + "/produce-batch",
		consume:    u + "/consume?payload_encoding=base64&wait=",
		consumeMax: u + "/consume-batch?payload_encoding=base64&max=",
		ack:        u + "/ack?receipt_handle=",
		ackBatch:   u + "/ack-batch",
	}
}

// client is the Producer and Consumer of one goroutine.
type client struct {
	t                                                  *Target
	produce, batch, consume, consumeMax, ack, ackBatch string
	body                                               []byte // the last batch request, reused
	resp                                               bytes.Buffer
	lastURL                                            string // the consume URL of lastMax and lastWait
	lastMax                                            int
	lastWait                                           time.Duration
}

// Produce posts the payload as application/octet-stream and expects 202 (durable).
func (c *client) Produce(ctx context.Context, payload []byte) error {
	st, msg, err := c.t.do(ctx, http.MethodPost, c.produce, "application/octet-stream", payload, &c.resp)
	if err != nil {
		return err
	}
	if st != http.StatusAccepted {
		return statusError("produce", st, msg)
	}
	return nil
}

// ProduceBatch posts one produce-batch with every payload base64-encoded.
func (c *client) ProduceBatch(ctx context.Context, payloads [][]byte) error {
	b := append(c.body[:0], `{"messages":[`...)
	for i, p := range payloads {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"payload":"`...)
		b = base64.StdEncoding.AppendEncode(b, p)
		b = append(b, `","payload_encoding":"base64"}`...)
	}
	b = append(b, "]}"...)
	c.body = b
	st, msg, err := c.t.do(ctx, http.MethodPost, c.batch, "application/json", b, &c.resp)
	if err != nil {
		return err
	}
	if st != http.StatusAccepted {
		return statusError("produce-batch", st, msg)
	}
	return nil
}

// The answers of the hot paths are decoded with the JSON v2 decoder (the basis of
// encoding/json/v2): several times cheaper than encoding/json, and the load generator
// shares the machine with the broker it measures.
type message struct {
	ReceiptHandle string `json:"receipt_handle"`
	Payload       []byte `json:"payload"` // base64 on the wire: every consume asks payload_encoding=base64
}

// Consume takes one message (consume) or up to max (consume-batch), long polling
// for wait; 204 is an empty result.
func (c *client) Consume(ctx context.Context, max int, wait time.Duration) ([]load.Delivery, error) {
	if c.lastURL == "" || max != c.lastMax || wait != c.lastWait {
		if max == 1 {
			c.lastURL = c.consume + wait.String()
		} else {
			c.lastURL = c.consumeMax + strconv.Itoa(max) + "&wait=" + wait.String()
		}
		c.lastMax, c.lastWait = max, wait
	}
	st, body, err := c.t.do(ctx, http.MethodGet, c.lastURL, "", nil, &c.resp)
	if err != nil {
		return nil, err
	}
	switch st {
	case http.StatusNoContent:
		return nil, nil
	case http.StatusOK:
	default:
		return nil, statusError("consume", st, body)
	}
	var ms []message
	if max == 1 {
		var m message
		if err := jsonv2.Unmarshal(body, &m); err != nil {
			return nil, fmt.Errorf("consume: %w", err)
		}
		ms = []message{m}
	} else {
		var l struct {
			Messages []message `json:"messages"`
		}
		if err := jsonv2.Unmarshal(body, &l); err != nil {
			return nil, fmt.Errorf("consume-batch: %w", err)
		}
		ms = l.Messages
	}
	out := make([]load.Delivery, len(ms))
	for i, m := range ms {
		out[i] = load.Delivery{Payload: m.Payload, Handle: m.ReceiptHandle}
	}
	return out, nil
}

// Ack settles one delivery with ack (204) or several with ack-batch, whose entries
// each must be 204.
func (c *client) Ack(ctx context.Context, ds []load.Delivery) (int, error) {
	if len(ds) == 1 {
		st, msg, err := c.t.do(ctx, http.MethodPost, c.ack+url.QueryEscape(ds[0].Handle), "", nil, &c.resp)
		if err != nil {
			return 0, err
		}
		if st != http.StatusNoContent {
			return 0, statusError("ack", st, msg)
		}
		return 1, nil
	}
	b := append(c.body[:0], `{"acks":[`...)
	for i, d := range ds {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"receipt_handle":`...)
		b = appendJSONString(b, d.Handle)
		b = append(b, '}')
	}
	b = append(b, "]}"...)
	c.body = b
	st, body, err := c.t.do(ctx, http.MethodPost, c.ackBatch, "application/json", b, &c.resp)
	if err != nil {
		return 0, err
	}
	if st != http.StatusOK {
		return 0, statusError("ack-batch", st, body)
	}
	var res struct {
		Results []struct {
			Status int `json:"status"`
			Error  *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		} `json:"results"`
	}
	if err := jsonv2.Unmarshal(body, &res); err != nil {
		return 0, fmt.Errorf("ack-batch: %w", err)
	}
	n := 0
	var first error
	for _, r := range res.Results {
		if r.Status == http.StatusNoContent {
			n++
		} else if first == nil {
			first = fmt.Errorf("ack-batch entry: %d", r.Status)
			if r.Error != nil {
				first = fmt.Errorf("ack-batch entry: %d %s: %s", r.Status, r.Error.Code, r.Error.Message)
			}
		}
	}
	if first == nil && n != len(ds) {
		first = fmt.Errorf("ack-batch: %d results for %d acks", len(res.Results), len(ds))
	}
	return n, first
}

// appendJSONString appends s as a JSON string; receipt handles are plain ASCII, so
// the slow path is only a safety net.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
