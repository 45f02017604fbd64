package workload

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/narad-mq/narad/verify/history"
)

// client is one simulated application: its own connection pool, every HTTP attempt
// recorded as history lines. In a cluster it knows every node: it starts on one (by
// its name, so clients spread), moves to the next after an attempt with no answer or a
// 5xx (the node may be down), and every spreadEvery attempts anyway, so every node
// serves every kind of request.
type client struct {
	name  string
	bases []string // the nodes' base URLs
	ids   []string // their ids, for the history ("" for a single node)
	cur   int
	n     int // attempts so far
	hc    *http.Client
	rec   *history.Writer
	clk   *history.Clock
}

// spreadEvery is how many attempts a cluster client sends to one node before it moves on.
const spreadEvery = 16

// endpoint is one node a client may send to.
type endpoint struct{ id, url string }

func newClient(name string, eps []endpoint, rec *history.Writer, clk *history.Clock) *client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	c := &client{name: name, hc: &http.Client{Transport: tr}, rec: rec, clk: clk}
	var h uint32
	for _, b := range []byte(name) {
		h = h*31 + uint32(b)
	}
	for _, ep := range eps {
		c.bases, c.ids = append(c.bases, ep.url), append(c.ids, ep.id)
	}
	c.cur = int(h % uint32(len(eps)))
	return c
}

// next moves the client to the next node.
func (c *client) next() { c.cur = (c.cur + 1) % len(c.bases) }

func (c *client) close() { c.hc.CloseIdleConnections() }

type apiErr struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// result is one HTTP attempt's outcome.
type result struct {
	status    int // 0: no answer
	code      string
	err       string
	body      []byte
	call, ret int64
	node      string // the node it was sent to ("" for a single node)
}

func (c *client) do(ctx context.Context, method, path string, q url.Values, body []byte, ctype string, timeout time.Duration) (r result) {
	c.n++
	if c.n%spreadEvery == 0 {
		c.next()
	}
	r.node = c.ids[c.cur]
	defer func() {
		if r.status == 0 || r.status >= 500 {
			c.next() // that node may be down, paused or cut off: try another
		}
	}()
	u := c.bases[c.cur] + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		panic(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	r.call = c.clk.Now()
	resp, err := c.hc.Do(req)
	if err != nil {
		r.ret = c.clk.Now()
		r.err = err.Error()
		return r
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	r.ret = c.clk.Now()
	if err != nil {
		// The status line arrived but not the whole body: the outcome is as unknown as
		// with no answer at all.
		r.err = "reading the body: " + err.Error()
		return r
	}
	r.status, r.body = resp.StatusCode, b
	if resp.StatusCode >= 400 {
		var e apiErr
		if json.Unmarshal(b, &e) == nil {
			r.code = e.Error.Code
		}
		if r.code == "" {
			r.code = "no_json_error_body"
		}
		r.err = fmt.Sprintf("%d %s", resp.StatusCode, truncate(string(b), 200))
	}
	return r
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (c *client) opEntry(op, topic string, r result) history.Entry {
	return history.Entry{Kind: history.KindOp, Client: c.name, Op: op, Topic: topic, Partition: -1, Offset: -1,
		Call: r.call, Return: r.ret, Status: r.status, Code: r.code, Err: r.err, Node: r.node}
}

// payload is what the workload sends: the id is what the checker follows.
type payload struct {
	ID  string `json:"id"`
	Pad string `json:"pad,omitempty"`
}

type produced struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// produce sends one message; it returns the attempt's result.
func (c *client) produce(ctx context.Context, topic, id, key string, pad string, try int) result {
	q := url.Values{}
	if key != "" {
		q.Set("key", key)
	}
	body, _ := json.Marshal(payload{ID: id, Pad: pad})
	c.rec.Add(history.Entry{Kind: history.KindIntent, Client: c.name, Op: history.OpProduce, Topic: topic, Msg: id, Attempt: try, Call: c.clk.Now(), Partition: -1, Offset: -1})
	r := c.do(ctx, http.MethodPost, "/v1/topics/"+topic+"/produce", q, body, "application/json", opTimeout)
	e := c.opEntry(history.OpProduce, topic, r)
	e.Msg, e.Key, e.Attempt = id, key, try
	if r.status == http.StatusAccepted {
		var p produced
		if err := json.Unmarshal(r.body, &p); err == nil {
			e.Partition, e.Offset = p.Partition, p.Offset
		} else {
			e.Err = "undecodable 202 body: " + err.Error()
		}
	}
	c.rec.Add(e)
	return r
}

type outMsg struct {
	Payload  any    `json:"payload"`
	Encoding string `json:"payload_encoding,omitempty"`
	Key      string `json:"key,omitempty"`
}

// produceBatch sends several messages at once; one history line per message. A batch
// whose pad has an odd length sends each payload's JSON as bytes (base64, as the SDKs
// send bytes: the broker reads such a body by its plain scanner, not its tokenizer),
// and such a message is delivered as bytes (payloadID reads both).
func (c *client) produceBatch(ctx context.Context, topic string, ids, keys []string, pad string, try int) result {
	msgs := make([]outMsg, len(ids))
	for i := range ids {
		p := payload{ID: ids[i], Pad: pad}
		msgs[i] = outMsg{Payload: p, Key: keys[i]}
		if len(pad)%2 == 1 {
			b, _ := json.Marshal(p)
			msgs[i].Payload, msgs[i].Encoding = base64.StdEncoding.EncodeToString(b), "base64"
		}
	}
	body, _ := json.Marshal(map[string]any{"messages": msgs})
	c.rec.Add(history.Entry{Kind: history.KindIntent, Client: c.name, Op: history.OpProduce, Topic: topic, IDs: ids, Attempt: try, Batch: true, Call: c.clk.Now(), Partition: -1, Offset: -1})
	r := c.do(ctx, http.MethodPost, "/v1/topics/"+topic+"/produce-batch", nil, body, "application/json", opTimeout)
	var res struct {
		Results []produced `json:"results"`
	}
	ok := r.status == http.StatusAccepted && json.Unmarshal(r.body, &res) == nil && len(res.Results) == len(ids)
	for i, id := range ids {
		e := c.opEntry(history.OpProduce, topic, r)
		e.Msg, e.Key, e.Attempt, e.Batch = id, keys[i], try, true
		if ok {
			e.Partition, e.Offset = res.Results[i].Partition, res.Results[i].Offset
		} else if r.status == http.StatusAccepted {
			e.Err = "undecodable 202 body"
		}
		c.rec.Add(e)
	}
	return r
}

type message struct {
	Topic     string          `json:"topic"`
	Partition int32           `json:"partition"`
	Offset    int64           `json:"offset"`
	Key       *string         `json:"key"`
	Payload   json.RawMessage `json:"payload"`
	Encoding  string          `json:"payload_encoding"`
	Timestamp int64           `json:"timestamp"`
	Handle    string          `json:"receipt_handle"`
	Attempt   int             `json:"delivery_attempt"`
}

// delivery is a message a consumer holds.
type delivery struct {
	topic     string
	partition int32
	offset    int64
	id        string
	handle    string
}

// handleIncarnation returns the topic incarnation a receipt handle names, or 0 when the
// handle does not decode. Clients treat handles as opaque; the spec says a handle names
// the incarnation, and the layout read here is version 1 of
// broker/internal/queue/handle.go (version byte, incarnation, partition, offset, nonce,
// CRC-32C; big-endian; unpadded URL-safe base64), which verify cannot import. The checker
// uses it to key a recreated topic's messages by incarnation and to see an old message
// delivered under a new incarnation's handle.
func handleIncarnation(h string) int64 {
	b, err := base64.RawURLEncoding.DecodeString(h)
	if err != nil || len(b) != 37 || b[0] != 1 {
		return 0
	}
	if binary.BigEndian.Uint32(b[33:]) != crc32.Checksum(b[:33], castagnoli) {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b[1:9]))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// payloadID is the message id a payload carries, or "?" and the start of a payload
// that carries none (the checker then finds it unexpected). A payload delivered as
// bytes (encoding "base64", produced so by produceBatch) is the payload's JSON.
func payloadID(raw json.RawMessage, encoding string) string {
	doc := []byte(raw)
	if encoding == "base64" {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "?" + truncate(string(raw), 60)
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return "?" + truncate(string(raw), 60)
		}
		doc = b
	}
	var p payload
	if err := json.Unmarshal(doc, &p); err != nil || p.ID == "" {
		return "?" + truncate(string(doc), 60)
	}
	return p.ID
}

func (c *client) deliveryEntry(topic string, r result, m message, batch bool) (history.Entry, delivery) {
	e := c.opEntry(history.OpConsume, topic, r)
	e.Partition, e.Offset, e.Handle, e.Attempt, e.Timestamp, e.Batch = m.Partition, m.Offset, m.Handle, m.Attempt, m.Timestamp, batch
	e.Incarnation = handleIncarnation(m.Handle)
	if m.Key != nil {
		e.Key = *m.Key
	}
	e.Msg = payloadID(m.Payload, m.Encoding)
	if m.Topic != topic {
		e.Err = "delivered with topic " + m.Topic
	}
	return e, delivery{topic: topic, partition: m.Partition, offset: m.Offset, id: e.Msg, handle: m.Handle}
}

// consume takes up to max messages (max > 1 uses consume-batch).
func (c *client) consume(ctx context.Context, topic string, max int, wait time.Duration) ([]delivery, result) {
	q := url.Values{"wait": {wait.String()}}
	path := "/v1/topics/" + topic + "/consume"
	if max > 1 {
		path += "-batch"
		q.Set("max", strconv.Itoa(max))
	}
	r := c.do(ctx, http.MethodGet, path, q, nil, "", wait+opTimeout)
	if r.status != http.StatusOK {
		e := c.opEntry(history.OpConsume, topic, r)
		c.rec.Add(e)
		return nil, r
	}
	var msgs []message
	if max > 1 {
		var l struct {
			Messages []message `json:"messages"`
		}
		if err := json.Unmarshal(r.body, &l); err != nil {
			r.err = "undecodable 200 body: " + err.Error()
		}
		msgs = l.Messages
	} else {
		var m message
		if err := json.Unmarshal(r.body, &m); err != nil {
			r.err = "undecodable 200 body: " + err.Error()
		} else {
			msgs = []message{m}
		}
	}
	if len(msgs) == 0 {
		c.rec.Add(c.opEntry(history.OpConsume, topic, r))
		return nil, r
	}
	out := make([]delivery, 0, len(msgs))
	for _, m := range msgs {
		e, d := c.deliveryEntry(topic, r, m, max > 1)
		c.rec.Add(e)
		out = append(out, d)
	}
	return out, r
}

// read replays up to max messages of topic's partition p from offset from, without
// leases; one history line per message (their ids, offsets and stamps), or one with
// none.
func (c *client) read(ctx context.Context, topic string, p int32, from int64, max int) result {
	q := url.Values{"from": {strconv.FormatInt(from, 10)}, "max": {strconv.Itoa(max)}}
	r := c.do(ctx, http.MethodGet, "/v1/topics/"+topic+"/partitions/"+strconv.Itoa(int(p))+"/messages", q, nil, "", opTimeout)
	var rng struct {
		Messages []message `json:"messages"`
	}
	if r.status == http.StatusOK {
		if err := json.Unmarshal(r.body, &rng); err != nil {
			r.err = "undecodable 200 body: " + err.Error()
		}
	}
	if len(rng.Messages) == 0 {
		e := c.opEntry(history.OpRead, topic, r)
		e.Partition, e.Offset = p, from
		c.rec.Add(e)
		return r
	}
	for _, m := range rng.Messages {
		e := c.opEntry(history.OpRead, topic, r)
		e.Partition, e.Offset, e.Timestamp = m.Partition, m.Offset, m.Timestamp
		e.Msg = payloadID(m.Payload, m.Encoding)
		if m.Partition != p {
			e.Err = fmt.Sprintf("read from partition %d, returned as partition %d", p, m.Partition)
		}
		c.rec.Add(e)
	}
	return r
}

// settle acks, nacks (extend "0") or renews (extend "true") one delivery.
func (c *client) settle(ctx context.Context, d delivery, op string) result {
	q := url.Values{"receipt_handle": {d.handle}}
	switch op {
	case history.OpNack:
		q.Set("extend", "0")
	case history.OpExtend:
		q.Set("extend", "true")
	}
	r := c.do(ctx, http.MethodPost, "/v1/topics/"+d.topic+"/ack", q, nil, "", opTimeout)
	e := c.opEntry(op, d.topic, r)
	e.Partition, e.Offset, e.Msg, e.Handle = d.partition, d.offset, d.id, d.handle
	e.Incarnation = handleIncarnation(d.handle)
	c.rec.Add(e)
	return r
}

// ackBatch acks several deliveries of one topic at once; one line per entry.
func (c *client) ackBatch(ctx context.Context, topic string, ds []delivery) result {
	type ack struct {
		Handle string `json:"receipt_handle"`
	}
	acks := make([]ack, len(ds))
	for i, d := range ds {
		acks[i] = ack{d.handle}
	}
	body, _ := json.Marshal(map[string]any{"acks": acks})
	r := c.do(ctx, http.MethodPost, "/v1/topics/"+topic+"/ack-batch", nil, body, "application/json", opTimeout)
	var res struct {
		Results []struct {
			Status int `json:"status"`
			Error  *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		} `json:"results"`
	}
	ok := r.status == http.StatusOK && json.Unmarshal(r.body, &res) == nil && len(res.Results) == len(ds)
	for i, d := range ds {
		e := c.opEntry(history.OpAck, topic, r)
		e.Partition, e.Offset, e.Msg, e.Handle, e.Batch = d.partition, d.offset, d.id, d.handle, true
		e.Incarnation = handleIncarnation(d.handle)
		if ok {
			e.Status, e.Code, e.Err = res.Results[i].Status, "", ""
			if x := res.Results[i].Error; x != nil {
				// The message too: a batch's storage_failed says whether part was stored.
				e.Code, e.Err = x.Code, fmt.Sprintf("%d %s: %s", e.Status, x.Code, truncate(x.Message, 200))
			}
		} else if r.status == http.StatusOK {
			e.Status, e.Err = 0, "undecodable ack-batch answer"
		}
		c.rec.Add(e)
	}
	return r
}

// PartitionStats is one partition's markers.
type PartitionStats struct {
	Partition     int32 `json:"partition"`
	Oldest        int64 `json:"oldest_offset"`
	Next          int64 `json:"next_offset"`
	HighWatermark int64 `json:"high_watermark"`
	Frontier      int64 `json:"ack_frontier"`
	AckedAhead    int64 `json:"acked_ahead"`
	InFlight      int64 `json:"in_flight"`
	Backlog       int64 `json:"backlog"`
	// In a cluster: the partition's leader and its term, each follower's progress, and
	// whether the node holding it could be reached (false: the counters are zeros).
	Leader    string   `json:"leader"`
	Epoch     int64    `json:"epoch"`
	Available *bool    `json:"available"`
	Replicas  []string `json:"replicas"`
	Followers []struct {
		Node  string `json:"node"`
		Match int64  `json:"match_offset"`
		Lag   int64  `json:"lag"`
	} `json:"followers"`
}

// unavailable reports whether the answering node could not reach the partition's
// holder: its counters are zeros, not markers.
func (s PartitionStats) unavailable() bool { return s.Available != nil && !*s.Available }

// stats reads a topic's partition markers and records them.
func (c *client) stats(ctx context.Context, topic string) ([]PartitionStats, bool) {
	st, _, r := c.topicInfo(ctx, topic)
	return st, r.status == http.StatusOK && st != nil
}

// topicInfo reads a topic (its markers are recorded as stats lines) and returns its
// incarnation.
func (c *client) topicInfo(ctx context.Context, topic string) ([]PartitionStats, int64, result) {
	r := c.do(ctx, http.MethodGet, "/v1/topics/"+topic, nil, nil, "", opTimeout)
	if r.status != http.StatusOK {
		return nil, 0, r
	}
	var t struct {
		Incarnation string           `json:"incarnation"`
		Stats       []PartitionStats `json:"partition_stats"`
	}
	if json.Unmarshal(r.body, &t) != nil {
		return nil, 0, r
	}
	inc, _ := strconv.ParseInt(t.Incarnation, 10, 64)
	for _, s := range t.Stats {
		if s.unavailable() {
			continue // zeros, not markers
		}
		c.rec.Add(history.Entry{Kind: history.KindStats, Client: c.name, Topic: topic, Partition: s.Partition,
			Call: r.call, Return: r.ret, Status: r.status, HighWatermark: s.HighWatermark, Frontier: s.Frontier,
			Oldest: s.Oldest, Backlog: s.Backlog, InFlight: s.InFlight, Incarnation: inc, Offset: s.Next,
			Node: r.node, Target: s.Leader, Epoch: s.Epoch})
	}
	return t.Stats, inc, r
}

// createTopic creates a topic of the workload (body as POST /v1/topics takes it) and
// records the attempt with the incarnation a 201 reports.
func (c *client) createTopic(ctx context.Context, body map[string]any) (int64, result) {
	b, _ := json.Marshal(body)
	r := c.do(ctx, http.MethodPost, "/v1/topics", nil, b, "application/json", opTimeout)
	name, _ := body["name"].(string)
	e := c.opEntry(history.OpCreateTopic, name, r)
	var inc int64
	if r.status == http.StatusCreated {
		var t struct {
			Incarnation string `json:"incarnation"`
		}
		if err := json.Unmarshal(r.body, &t); err == nil {
			inc, _ = strconv.ParseInt(t.Incarnation, 10, 64)
		}
		if inc == 0 {
			e.Err = "201 without a readable incarnation: " + truncate(string(r.body), 200)
		}
		e.Incarnation = inc
	}
	c.rec.Add(e)
	return inc, r
}

// deleteTopic deletes a topic and records the attempt.
func (c *client) deleteTopic(ctx context.Context, name string) result {
	r := c.do(ctx, http.MethodDelete, "/v1/topics/"+name, nil, nil, "", opTimeout)
	c.rec.Add(c.opEntry(history.OpDeleteTopic, name, r))
	return r
}

// childLag returns the summed fan-out lag of parent's children.
func (c *client) childLag(ctx context.Context, parent string) (int64, bool) {
	r := c.do(ctx, http.MethodGet, "/v1/topics/"+parent+"/children", nil, nil, "", opTimeout)
	if r.status != http.StatusOK {
		return 0, false
	}
	var l struct {
		Children []struct {
			Lag []struct {
				Lag int64 `json:"lag"`
			} `json:"lag"`
		} `json:"children"`
	}
	if json.Unmarshal(r.body, &l) != nil {
		return 0, false
	}
	var sum int64
	for _, ch := range l.Children {
		for _, x := range ch.Lag {
			sum += x.Lag
		}
	}
	return sum, true
}

// admin sends an admin request and records it.
func (c *client) admin(ctx context.Context, method, path string, body any) result {
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	r := c.do(ctx, method, path, nil, b, "application/json", opTimeout)
	e := c.opEntry(history.OpAdmin, path, r)
	e.Detail = method
	c.rec.Add(e)
	return r
}
