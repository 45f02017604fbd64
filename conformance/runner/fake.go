package runner

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Fake is the wire tier's scripted stand-in for narad: just enough of the API for an
// SDK to produce, consume, settle and inspect topics, with deterministic answers.
// Scenarios script everything unusual through faults in front of it.
type Fake struct {
	MaxWait time.Duration

	mu      sync.Mutex
	topics  map[string]*fakeTopic
	handles int
}

type fakeTopic struct {
	name       string
	partitions int
	visibility int64
	next       []int64
	queue      []fakeMsg
	attempts   map[[2]int64]int64
	// redeliver turns on leases: a leased message comes back (attempt + 1) when its
	// lease lapses, after the visibility timeout or the last extend (a nack with a delay
	// is an extend), unless it was acked first. Off, a message is delivered once.
	redeliver bool
	leases    map[string]*time.Timer // receipt handle → the lapse of its lease
	leased    map[string]fakeMsg
}

type fakeMsg struct {
	partition, offset int64
	body              []byte
	key               *string
}

// SetRedeliver turns on lease lapses for topic name (TopicSpec.Redeliver).
func (f *Fake) SetRedeliver(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.topics[name]; t != nil {
		t.redeliver = true
		t.leases, t.leased = map[string]*time.Timer{}, map[string]fakeMsg{}
	}
}

// lease starts or moves the lapse of handle's lease to d from now; f.mu is held.
func (f *Fake) lease(t *fakeTopic, handle string, m fakeMsg, d time.Duration) {
	if old := t.leases[handle]; old != nil {
		old.Stop()
	}
	t.leased[handle] = m
	t.leases[handle] = time.AfterFunc(d, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, held := t.leased[handle]; held {
			delete(t.leased, handle)
			delete(t.leases, handle)
			t.queue = append(t.queue, m)
		}
	})
}

// settle applies an ack (extend "") or an extend to a leased message of a redelivering
// topic; f.mu is held.
func (f *Fake) settle(t *fakeTopic, handle, extend string) {
	m, held := t.leased[handle]
	if !held {
		return
	}
	if extend == "" {
		t.leases[handle].Stop()
		delete(t.leases, handle)
		delete(t.leased, handle)
		return
	}
	d := time.Duration(t.visibility) * time.Millisecond
	if extend != "true" {
		ms, _ := durationMs(extend) // digits are milliseconds here, unlike a poll's wait
		d = time.Duration(ms * float64(time.Millisecond))
	}
	f.lease(t, handle, m, d)
}

// NewFake returns an empty fake broker.
func NewFake(maxWait time.Duration) *Fake {
	return &Fake{MaxWait: maxWait, topics: map[string]*fakeTopic{}}
}

// AddTopic creates a topic, optionally with messages waiting in it.
func (f *Fake) AddTopic(name string, partitions int, visibilityMs int64, queue []string) {
	if partitions <= 0 {
		partitions = 1
	}
	if visibilityMs <= 0 {
		visibilityMs = 30000
	}
	t := &fakeTopic{name: name, partitions: partitions, visibility: visibilityMs, next: make([]int64, partitions), attempts: map[[2]int64]int64{}}
	for _, q := range queue {
		t.append([]byte(q), nil, -1)
	}
	f.mu.Lock()
	f.topics[name] = t
	f.mu.Unlock()
}

func (t *fakeTopic) append(body []byte, key *string, partition int) fakeMsg {
	if partition < 0 || partition >= t.partitions {
		partition = 0
	}
	m := fakeMsg{partition: int64(partition), offset: t.next[partition], body: body, key: key}
	t.next[partition]++
	t.queue = append(t.queue, m)
	return m
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": code, "message": msg}})
}

func (f *Fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if path == "/readyz" || path == "/healthz" {
		writeJSON(w, 200, map[string]any{"status": "ready"})
		return
	}
	if path == "/v1/cluster" && r.Method == http.MethodGet {
		// Every endpoint of a wire scenario fronts this one fake: one node, so a
		// client's one-cluster check finds one cluster and stays quiet.
		writeJSON(w, 200, map[string]any{"node_id": "fake", "controller": "fake",
			"members": []map[string]any{{"id": "fake", "address": "127.0.0.1:0", "status": "alive"}}})
		return
	}
	if path == "/v1/topics" && r.Method == http.MethodPost {
		var req struct {
			Name                string `json:"name"`
			Partitions          int    `json:"partitions"`
			VisibilityTimeoutMs int64  `json:"visibility_timeout_ms"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Name == "" {
			writeErr(w, 400, "invalid_json", "bad create request")
			return
		}
		f.AddTopic(req.Name, req.Partitions, req.VisibilityTimeoutMs, nil)
		f.mu.Lock()
		t := f.topics[req.Name]
		f.mu.Unlock()
		writeJSON(w, 201, t.info(false))
		return
	}
	rest, ok := strings.CutPrefix(path, "/v1/topics/")
	if !ok {
		writeErr(w, 404, "not_found", "no such route")
		return
	}
	name, sub, _ := strings.Cut(rest, "/")
	name, _ = url.PathUnescape(name)
	f.mu.Lock()
	t := f.topics[name]
	f.mu.Unlock()
	if t == nil {
		writeErr(w, 404, "topic_not_found", "no topic "+name)
		return
	}
	switch {
	case sub == "" && r.Method == http.MethodGet:
		writeJSON(w, 200, t.info(true))
	case sub == "produce" && r.Method == http.MethodPost:
		body := readAll(r)
		var key *string
		if k, ok := r.URL.Query()["key"]; ok {
			key = &k[0]
		}
		part := atoiDefault(r.URL.Query().Get("partition"), -1)
		f.mu.Lock()
		m := t.append(body, key, part)
		f.mu.Unlock()
		writeJSON(w, 202, map[string]any{"topic": name, "partition": m.partition, "offset": m.offset})
	case sub == "produce-batch" && r.Method == http.MethodPost:
		var req struct {
			Messages []struct {
				Payload         json.RawMessage `json:"payload"`
				PayloadEncoding string          `json:"payload_encoding"`
				Key             *string         `json:"key"`
				Partition       *int            `json:"partition"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(readAll(r), &req); err != nil || len(req.Messages) == 0 {
			writeErr(w, 400, "invalid_json", "bad batch")
			return
		}
		var results []any
		f.mu.Lock()
		for _, m := range req.Messages {
			body := []byte(m.Payload)
			if m.PayloadEncoding == "base64" {
				var s string
				_ = json.Unmarshal(m.Payload, &s)
				body, _ = base64.StdEncoding.DecodeString(s)
			}
			p := -1
			if m.Partition != nil {
				p = *m.Partition
			}
			got := t.append(body, m.Key, p)
			results = append(results, map[string]any{"topic": name, "partition": got.partition, "offset": got.offset})
		}
		f.mu.Unlock()
		writeJSON(w, 202, map[string]any{"results": results})
	case (sub == "consume" || sub == "consume-batch") && r.Method == http.MethodGet:
		max := 1
		if sub == "consume-batch" {
			max = atoiDefault(r.URL.Query().Get("max"), 10)
		}
		wait := parseWait(r.URL.Query().Get("wait"))
		if wait > f.MaxWait {
			wait = f.MaxWait
		}
		deadline := time.Now().Add(wait)
		for {
			f.mu.Lock()
			var out []any
			for len(t.queue) > 0 && len(out) < max {
				m := t.queue[0]
				t.queue = t.queue[1:]
				f.handles++
				k := [2]int64{m.partition, m.offset}
				t.attempts[k]++
				wm := map[string]any{"topic": name, "partition": m.partition, "offset": m.offset, "key": m.key,
					"payload": base64.StdEncoding.EncodeToString(m.body), "payload_encoding": "base64",
					"timestamp": time.Now().UnixMilli(), "receipt_handle": fmt.Sprintf("h%d-%s-%d-%d", f.handles, name, m.partition, m.offset),
					"delivery_attempt": t.attempts[k]}
				if t.redeliver {
					f.lease(t, wm["receipt_handle"].(string), m, time.Duration(t.visibility)*time.Millisecond)
				}
				out = append(out, wm)
			}
			f.mu.Unlock()
			if len(out) > 0 {
				if sub == "consume" {
					writeJSON(w, 200, out[0])
				} else {
					writeJSON(w, 200, map[string]any{"messages": out})
				}
				return
			}
			if !time.Now().Before(deadline) {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			select {
			case <-time.After(20 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	case sub == "ack" && r.Method == http.MethodPost:
		if t.redeliver {
			f.mu.Lock()
			f.settle(t, r.URL.Query().Get("receipt_handle"), r.URL.Query().Get("extend"))
			f.mu.Unlock()
		}
		w.WriteHeader(http.StatusNoContent)
	case sub == "ack-batch" && r.Method == http.MethodPost:
		var req struct {
			Acks []struct {
				ReceiptHandle string `json:"receipt_handle"`
			} `json:"acks"`
		}
		_ = json.Unmarshal(readAll(r), &req)
		var results []any
		for _, a := range req.Acks {
			results = append(results, map[string]any{"receipt_handle": a.ReceiptHandle, "status": 204})
		}
		writeJSON(w, 200, map[string]any{"results": results})
	case strings.HasPrefix(sub, "partitions/") && r.Method == http.MethodGet:
		writeJSON(w, 200, map[string]any{"messages": []any{}, "next_offset": 0})
	default:
		writeErr(w, 404, "not_found", "the fake broker does not serve "+r.Method+" "+path)
	}
}

func (t *fakeTopic) info(stats bool) map[string]any {
	out := map[string]any{"name": t.name, "incarnation": "fake-1", "partitions": t.partitions, "retention_ms": 604800000,
		"visibility_timeout_ms": t.visibility, "max_in_flight_per_partition": 1024, "max_acked_ahead_per_partition": 1024,
		"replication_factor": 1, "created_at": "2026-01-01T00:00:00Z"}
	if stats {
		var ps []any
		for p := 0; p < t.partitions; p++ {
			ps = append(ps, map[string]any{"partition": p, "oldest_offset": 0, "next_offset": t.next[p], "high_watermark": t.next[p],
				"ack_frontier": 0, "acked_ahead": 0, "in_flight": 0, "backlog": 0, "leader": "fake", "replicas": []string{"fake"}})
		}
		out["partition_stats"] = ps
	}
	return out
}

func readAll(r *http.Request) []byte {
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return []byte(b.String())
}

func parseWait(s string) time.Duration {
	if s == "" {
		return 0
	}
	if d, err := time.ParseDuration(s); err == nil {
		return d
	}
	if n, err := strconv.Atoi(s); err == nil {
		return time.Duration(n) * time.Second
	}
	return 0
}
