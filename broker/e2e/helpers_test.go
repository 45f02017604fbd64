// Package e2e tests the real narad binary as a black box: each test starts its own
// broker process on a free 127.0.0.1 port with a temporary data directory, talks to it
// over HTTP only, and validates every response against openapi.yaml.
package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBuild()
	os.Exit(code)
}

// api wraps the validating client with the broker's operations. Its helpers report
// failures with t.Errorf so goroutines may use them.
type api struct {
	*testutil.Client
	t testing.TB
}

// startBroker starts a broker with extra flags and returns it with a client.
func startBroker(t *testing.T, args ...string) (*testutil.Narad, *api) {
	t.Helper()
	n := testutil.StartNarad(t, testutil.Options{Args: args})
	return n, &api{Client: n.Client(), t: t}
}

type topicJSON struct {
	Name                      string `json:"name"`
	Incarnation               string `json:"incarnation"`
	Partitions                int32  `json:"partitions"`
	RetentionMs               int64  `json:"retention_ms"`
	VisibilityTimeoutMs       int64  `json:"visibility_timeout_ms"`
	MaxInFlightPerPartition   int32  `json:"max_in_flight_per_partition"`
	MaxAckedAheadPerPartition int32  `json:"max_acked_ahead_per_partition"`
	ReplicationFactor         int32  `json:"replication_factor"`
	CreatedAt                 string `json:"created_at"`
}

type partitionStats struct {
	Partition     int32    `json:"partition"`
	OldestOffset  int64    `json:"oldest_offset"`
	NextOffset    int64    `json:"next_offset"`
	HighWatermark int64    `json:"high_watermark"`
	AckFrontier   int64    `json:"ack_frontier"`
	AckedAhead    int64    `json:"acked_ahead"`
	InFlight      int64    `json:"in_flight"`
	Backlog       int64    `json:"backlog"`
	Leader        string   `json:"leader"`
	Replicas      []string `json:"replicas"`
	Available     *bool    `json:"available"`
}

type topicDetail struct {
	topicJSON
	PartitionStats []partitionStats `json:"partition_stats"`
}

type produced struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

type message struct {
	Topic           string          `json:"topic"`
	Partition       int32           `json:"partition"`
	Offset          int64           `json:"offset"`
	Key             *string         `json:"key"`
	Payload         json.RawMessage `json:"payload"`
	PayloadEncoding string          `json:"payload_encoding"`
	Timestamp       int64           `json:"timestamp"`
	ReceiptHandle   string          `json:"receipt_handle"`
	DeliveryAttempt int32           `json:"delivery_attempt"`
}

// bytesOf returns the payload's bytes when it came base64-encoded.
func (m *message) bytesOf(t testing.TB) []byte {
	t.Helper()
	if m.PayloadEncoding != "base64" {
		t.Errorf("offset %d: payload_encoding %q, want base64; payload %s", m.Offset, m.PayloadEncoding, m.Payload)
		return nil
	}
	var s string
	if err := json.Unmarshal(m.Payload, &s); err != nil {
		t.Errorf("offset %d: base64 payload is not a JSON string: %s", m.Offset, m.Payload)
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Errorf("offset %d: payload is not standard base64: %v", m.Offset, err)
	}
	return b
}

// where names a message's place in the log.
func (m *message) where() string { return fmt.Sprintf("%d/%d", m.Partition, m.Offset) }

type messageRange struct {
	Messages    []message `json:"messages"`
	NextOffset  int64     `json:"next_offset"`
	Incarnation string    `json:"incarnation"`
	Damaged     []int64   `json:"damaged"`
}

type ackResult struct {
	ReceiptHandle string `json:"receipt_handle"`
	Status        int    `json:"status"`
	Error         *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func topicPath(name string) string { return "/v1/topics/" + url.PathEscape(name) }

// createTopic creates a topic with the given settings (name is added) and returns it.
func (a *api) createTopic(name string, settings map[string]any) topicJSON {
	a.t.Helper()
	body := map[string]any{"name": name}
	for k, v := range settings {
		body[k] = v
	}
	r := a.PostJSON("/v1/topics", body)
	var tj topicJSON
	if r.Expect(a.t, http.StatusCreated) {
		r.JSON(a.t, &tj)
	}
	return tj
}

func (a *api) topic(name string) topicDetail {
	a.t.Helper()
	r := a.Get(topicPath(name))
	var td topicDetail
	if r.Expect(a.t, http.StatusOK) {
		r.JSON(a.t, &td)
	}
	return td
}

func (a *api) topicNames() []string {
	a.t.Helper()
	r := a.Get("/v1/topics")
	var l struct {
		Topics []topicJSON `json:"topics"`
	}
	if r.Expect(a.t, http.StatusOK) {
		r.JSON(a.t, &l)
	}
	var names []string
	for _, tj := range l.Topics {
		names = append(names, tj.Name)
	}
	return names
}

// produce sends body with the content type (empty: none) and query (without "?").
func (a *api) produce(topic string, body []byte, contentType, query string) produced {
	a.t.Helper()
	path := topicPath(topic) + "/produce"
	if query != "" {
		path += "?" + query
	}
	var hdr []string
	if contentType != "" {
		hdr = []string{"Content-Type", contentType}
	}
	r := a.Do(http.MethodPost, path, body, hdr...)
	var p produced
	if r.Expect(a.t, http.StatusAccepted) {
		r.JSON(a.t, &p)
	}
	return p
}

// produceJSON produces v as application/json.
func (a *api) produceJSON(topic string, v any, query string) produced {
	a.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		a.t.Errorf("marshal: %v", err)
	}
	return a.produce(topic, b, "application/json", query)
}

// consume takes one message; nil on 204. query is added as is.
func (a *api) consume(topic, query string) *message {
	a.t.Helper()
	path := topicPath(topic) + "/consume"
	if query != "" {
		path += "?" + query
	}
	r := a.Get(path)
	switch r.Status {
	case http.StatusNoContent:
		return nil
	case http.StatusOK:
		var m message
		if r.JSON(a.t, &m) {
			return &m
		}
		return nil
	}
	a.t.Errorf("GET %s: status %d, want 200 or 204; body %s", path, r.Status, r.Body)
	return nil
}

// mustConsume takes one message within wait and fails the test when none came.
func (a *api) mustConsume(topic, wait string) *message {
	a.t.Helper()
	m := a.consume(topic, "wait="+wait)
	if m == nil {
		a.t.Fatalf("consume %s: no message within %s", topic, wait)
	}
	return m
}

func (a *api) consumeBatch(topic string, max int, wait string) []message {
	a.t.Helper()
	r := a.Get(topicPath(topic) + "/consume-batch?max=" + strconv.Itoa(max) + "&wait=" + wait)
	if r.Status == http.StatusNoContent {
		return nil
	}
	var l struct {
		Messages []message `json:"messages"`
	}
	if r.Expect(a.t, http.StatusOK) {
		r.JSON(a.t, &l)
	}
	return l.Messages
}

// ack posts an ack; extend "" means none. It returns the response for the caller to
// check.
func (a *api) ack(topic, handle, extend string) *testutil.Response {
	a.t.Helper()
	q := "receipt_handle=" + url.QueryEscape(handle)
	if extend != "" {
		q += "&extend=" + url.QueryEscape(extend)
	}
	return a.Do(http.MethodPost, topicPath(topic)+"/ack?"+q, nil)
}

func (a *api) mustAck(topic string, m *message) {
	a.t.Helper()
	a.ack(topic, m.ReceiptHandle, "").Expect(a.t, http.StatusNoContent)
}

// read replays a partition with the query given.
func (a *api) read(topic string, part int, query string) messageRange {
	a.t.Helper()
	path := topicPath(topic) + "/partitions/" + strconv.Itoa(part) + "/messages"
	if query != "" {
		path += "?" + query
	}
	r := a.Get(path)
	var mr messageRange
	if r.Expect(a.t, http.StatusOK) {
		r.JSON(a.t, &mr)
	}
	return mr
}

// readAll replays a whole partition from offset 0.
func (a *api) readAll(topic string, part int) []message {
	a.t.Helper()
	var out []message
	from := int64(0)
	for i := 0; i < 10000; i++ {
		mr := a.read(topic, part, "max=1000&from="+strconv.FormatInt(from, 10))
		out = append(out, mr.Messages...)
		if len(mr.Messages) == 0 {
			return out
		}
		from = mr.NextOffset
	}
	a.t.Fatalf("replay of %s/%d does not end", topic, part)
	return nil
}

// drain consumes and acks until a consume with a short wait answers 204, and returns
// every message it took.
func (a *api) drain(topic string) []message {
	a.t.Helper()
	var out []message
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ms := a.consumeBatch(topic, 100, "200ms")
		if len(ms) == 0 {
			return out
		}
		acks := make([]map[string]string, len(ms))
		for i, m := range ms {
			acks[i] = map[string]string{"receipt_handle": m.ReceiptHandle}
		}
		r := a.PostJSON(topicPath(topic)+"/ack-batch", map[string]any{"acks": acks})
		var res struct {
			Results []ackResult `json:"results"`
		}
		if r.Expect(a.t, http.StatusOK) && r.JSON(a.t, &res) {
			for i, ar := range res.Results {
				if ar.Status != http.StatusNoContent {
					a.t.Errorf("drain: ack of %s: status %d (%+v)", ms[i].where(), ar.Status, ar.Error)
				}
			}
		}
		out = append(out, ms...)
	}
	a.t.Fatalf("drain of %s did not finish within 60 s", topic)
	return nil
}

// payloadID extracts the "id" field of a JSON object payload.
func payloadID(t testing.TB, m *message) string {
	t.Helper()
	var v struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(m.Payload, &v); err != nil || v.ID == "" {
		t.Errorf("message %s: payload %s has no id", m.where(), m.Payload)
	}
	return v.ID
}

// waitFor polls cond until it holds; see testutil.WaitFor.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, timeout, what, cond)
}

// waitParked waits until the broker reports n consumes parked in a long poll
// (narad_consume_waiting). While /metrics is not served, it falls back to giving the
// request a moment to arrive.
func waitParked(t *testing.T, a *api, n int) {
	t.Helper()
	if _, ok := metricValue(a, "narad_consume_waiting"); !ok {
		time.Sleep(500 * time.Millisecond)
		return
	}
	waitFor(t, 10*time.Second, "the consume to park", func() bool {
		v, _ := metricValue(a, "narad_consume_waiting")
		return v >= float64(n)
	})
}

// metricValue reads one unlabelled sample from /metrics, with a's credentials (with
// security on, /metrics needs an admin).
func metricValue(a *api, name string) (float64, bool) {
	resp, err := a.Try(http.MethodGet, "/metrics", nil)
	if err != nil || resp.Status != http.StatusOK {
		return 0, false
	}
	body := resp.Body
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}
