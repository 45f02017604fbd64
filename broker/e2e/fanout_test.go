package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"
)

type childJSON struct {
	Child         string `json:"child"`
	FanoutDelayMs int64  `json:"fanout_delay_ms"`
	Lag           []struct {
		Partition        int32 `json:"partition"`
		ParentNextOffset int64 `json:"parent_next_offset"`
		ChildCursor      int64 `json:"child_cursor"`
		Lag              int64 `json:"lag"`
	} `json:"lag"`
}

func (a *api) children(parent string) []childJSON {
	a.t.Helper()
	var l struct {
		Children []childJSON `json:"children"`
	}
	r := a.Get(topicPath(parent) + "/children")
	if r.Expect(a.t, http.StatusOK) {
		r.JSON(a.t, &l)
	}
	return l.Children
}

func (a *api) lagOf(parent, child string) int64 {
	for _, c := range a.children(parent) {
		if c.Child == child {
			n := int64(0)
			for _, l := range c.Lag {
				n += l.Lag
			}
			return n
		}
	}
	return -1
}

// ids drains a topic and returns the payload ids it held, with how often each came.
func (a *api) drainIDs(topic string) map[string]int {
	a.t.Helper()
	out := map[string]int{}
	for _, m := range a.drain(topic) {
		out[payloadID(a.t, &m)]++
	}
	return out
}

// TestFanoutAttachListDetach: every message committed after attach reaches the child
// with its key; lag drains to 0; detach stops the copy; re-attach starts at the tail.
func TestFanoutAttachListDetach(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("orders", map[string]any{"partitions": 2})
	a.createTopic("same", map[string]any{"partitions": 2})
	a.createTopic("fewer", map[string]any{"partitions": 1})
	a.produceJSON("orders", map[string]any{"id": "before"}, "")
	a.PostJSON("/v1/topics/orders/children", map[string]any{"child": "same"}).Expect(t, http.StatusCreated)
	a.PostJSON("/v1/topics/orders/children", map[string]any{"child": "fewer"}).Expect(t, http.StatusCreated)
	want := map[string]int{}
	where := map[string]int32{}
	for i := 0; i < 40; i++ {
		id := fmt.Sprintf("m%d", i)
		p := a.produceJSON("orders", map[string]any{"id": id}, "key=k"+fmt.Sprint(i%7))
		want[id] = 1
		where[id] = p.Partition
	}
	waitFor(t, 20*time.Second, "the children to catch up", func() bool {
		return a.lagOf("orders", "same") == 0 && a.lagOf("orders", "fewer") == 0
	})
	for _, child := range []string{"same", "fewer"} {
		got := map[string]int{}
		for _, m := range a.drain(child) {
			id := payloadID(t, &m)
			got[id]++
			if child == "same" && m.Partition != where[id] {
				t.Errorf("%s: %s in partition %d, parent wrote it to %d", child, id, m.Partition, where[id])
			}
			if m.Key == nil || *m.Key == "" {
				t.Errorf("%s: %s lost its key", child, id)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s got %v, want every message after attach once (no backfill of \"before\")", child, got)
		}
	}
	a.Do("DELETE", "/v1/topics/orders/children/same", nil).Expect(t, http.StatusNoContent)
	a.Do("DELETE", "/v1/topics/orders/children/same", nil).ExpectError(t, http.StatusNotFound, "child_not_found")
	a.produceJSON("orders", map[string]any{"id": "after-detach"}, "")
	a.PostJSON("/v1/topics/orders/children", map[string]any{"child": "same"}).Expect(t, http.StatusCreated)
	a.produceJSON("orders", map[string]any{"id": "after-reattach"}, "")
	waitFor(t, 20*time.Second, "the re-attached child to catch up", func() bool { return a.lagOf("orders", "same") == 0 })
	if got := a.drainIDs("same"); fmt.Sprint(got) != fmt.Sprint(map[string]int{"after-reattach": 1}) {
		t.Errorf("after detach and re-attach the child got %v, want only after-reattach", got)
	}
}

// TestFanoutRefusals: create-with-parent rolls back, chains, a second parent, produce
// into a delay child, and retention shorter than a delay are all 409 with no change.
func TestFanoutRefusals(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("p", map[string]any{"partitions": 1})
	a.createTopic("c", map[string]any{"partitions": 1})
	a.createTopic("other", map[string]any{"partitions": 1})
	a.PostJSON("/v1/topics/p/children", map[string]any{"child": "c"}).Expect(t, http.StatusCreated)
	before := a.topicNames()
	a.PostJSON("/v1/topics", map[string]any{"name": "grandchild", "parent": "c"}).ExpectError(t, http.StatusConflict, "conflict")
	if got := a.topicNames(); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Errorf("a refused create-with-parent left topics %v (before %v)", got, before)
	}
	a.PostJSON("/v1/topics/c/children", map[string]any{"child": "other"}).ExpectError(t, http.StatusConflict, "conflict")
	a.PostJSON("/v1/topics/other/children", map[string]any{"child": "c"}).ExpectError(t, http.StatusConflict, "conflict")
	a.PostJSON("/v1/topics/other/children", map[string]any{"child": "p"}).ExpectError(t, http.StatusConflict, "conflict")
	a.PostJSON("/v1/topics/p/children", map[string]any{"child": "p"}).ExpectError(t, http.StatusConflict, "conflict")
	a.PostJSON("/v1/topics/p/children", map[string]any{"child": "nope"}).ExpectError(t, http.StatusNotFound, "topic_not_found")
	a.PostJSON("/v1/topics/nope/children", map[string]any{"child": "other"}).ExpectError(t, http.StatusNotFound, "topic_not_found")
	// Delay rules: the parent keeps messages at least an hour past the delay.
	a.createTopic("short", map[string]any{"partitions": 1, "retention_ms": 2 * 3600 * 1000})
	a.PostJSON("/v1/topics/short/children", map[string]any{"child": "other", "fanout_delay_ms": 3600*1000 + 1}).ExpectError(t, http.StatusConflict, "conflict")
	a.PostJSON("/v1/topics/short/children", map[string]any{"child": "other", "fanout_delay_ms": 3600 * 1000}).Expect(t, http.StatusCreated)
	a.PatchJSON("/v1/topics/short", map[string]any{"retention_ms": 2*3600*1000 - 1}).ExpectError(t, http.StatusConflict, "conflict")
	a.Do("POST", "/v1/topics/other/produce", []byte(`{"x":1}`)).ExpectError(t, http.StatusConflict, "conflict")
	a.PostJSON("/v1/topics/other/produce-batch", map[string]any{"messages": []any{map[string]any{"payload": 1}}}).ExpectError(t, http.StatusConflict, "conflict")
	a.PostJSON("/v1/topics/p/children", map[string]any{"child": "other", "fanout_delay_ms": -1}).ExpectError(t, http.StatusBadRequest, "invalid_json")
	// Deleting the parent detaches its children; a recreated parent has none.
	a.Do("DELETE", "/v1/topics/p", nil).Expect(t, http.StatusNoContent)
	a.createTopic("p", map[string]any{"partitions": 1})
	if cs := a.children("p"); len(cs) != 0 {
		t.Errorf("a recreated parent has children %+v", cs)
	}
	a.produceJSON("p", map[string]any{"id": "new-incarnation"}, "")
	a.produceJSON("c", map[string]any{"id": "direct"}, "")
	if got := a.drainIDs("c"); fmt.Sprint(got) != fmt.Sprint(map[string]int{"direct": 1}) {
		t.Errorf("the old child got %v from a recreated parent", got)
	}
}

// TestFanoutSurvivesKill: kill -9 while a parent is being produced to and copied; after
// restart every message the parent answered 202 reaches the child (duplicates allowed).
func TestFanoutSurvivesKill(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t)
	a.createTopic("src", map[string]any{"partitions": 3})
	a.createTopic("dst", map[string]any{"partitions": 2})
	a.PostJSON("/v1/topics/src/children", map[string]any{"child": "dst"}).Expect(t, http.StatusCreated)
	var mu sync.Mutex
	acked := map[string]bool{}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("w%d-%d", w, i)
				body, _ := json.Marshal(map[string]any{"id": id})
				r, err := a.Try("POST", "/v1/topics/src/produce?key="+id, body, "Content-Type", "application/json")
				if err != nil {
					return // the broker is gone
				}
				if r.Status == http.StatusAccepted {
					mu.Lock()
					acked[id] = true
					mu.Unlock()
				}
			}
		}()
	}
	waitFor(t, 30*time.Second, "some messages to be copied", func() bool {
		v, _ := metricValue(a, "narad_messages_produced_total")
		mu.Lock()
		n := len(acked) // the producers write it: read it under mu
		mu.Unlock()
		return a.lagOf("src", "dst") >= 0 && v >= 0 && n > 200
	})
	n.Kill()
	close(stop)
	wg.Wait()
	n.RestartAfterKill()
	waitFor(t, 30*time.Second, "the child to catch up after restart", func() bool { return a.lagOf("src", "dst") == 0 })
	got := a.drainIDs("dst")
	lost := 0
	for id := range acked {
		if got[id] == 0 {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d messages answered 202 by the parent never reached the child", lost, len(acked))
	}
	t.Logf("%d parent messages, all copied (%d distinct in the child)", len(acked), len(got))
}

// TestDelayNeverEarly: every copy in a 2 s delay child is stamped no earlier than its
// parent commit plus 2 s — also across a kill -9 inside the delay window — and the
// spread of lateness is reported.
func TestDelayNeverEarly(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t)
	const delay = 2000
	a.createTopic("src", map[string]any{"partitions": 2})
	a.createTopic("later", map[string]any{"partitions": 2, "parent": "src", "fanout_delay_ms": delay})
	parentTS := map[string]int64{}
	produce := func(prefix string, count int) {
		for i := 0; i < count; i++ {
			id := fmt.Sprintf("%s-%d", prefix, i)
			p := a.produceJSON("src", map[string]any{"id": id}, "")
			var mr messageRange
			r := a.Get(fmt.Sprintf("/v1/topics/src/partitions/%d/messages?from=%d&max=1", p.Partition, p.Offset))
			if r.Expect(t, http.StatusOK) && r.JSON(t, &mr) && len(mr.Messages) == 1 {
				parentTS[id] = mr.Messages[0].Timestamp
			}
		}
	}
	produce("a", 150)
	// The first copies are due 2 s after their parent: 150 produces on a loaded machine
	// may take that long, so a copy consumed now is early only if it is due later.
	if m := a.consume("later", ""); m != nil {
		id := payloadID(t, m)
		if now := time.Now().UnixMilli(); now < parentTS[id]+delay {
			t.Fatalf("a delayed copy of %s was consumable %d ms after its parent, before its %d ms delay", id, now-parentTS[id], delay)
		}
	}
	produce("b", 50)
	n.Kill() // inside the delay window of the "b" messages
	n.RestartAfterKill()
	var minLate, maxLate int64 = 1 << 62, -1 << 62
	seen := map[string]bool{}
	deadline := time.Now().Add(60 * time.Second)
	for len(seen) < len(parentTS) && time.Now().Before(deadline) {
		for _, m := range a.consumeBatch("later", 100, "1s") {
			id := payloadID(t, &m)
			seen[id] = true
			late := m.Timestamp - (parentTS[id] + delay)
			if late < 0 {
				t.Errorf("%s copied %d ms early", id, -late)
			}
			minLate, maxLate = min(minLate, late), max(maxLate, late)
			a.mustAck("later", &m)
		}
	}
	if len(seen) != len(parentTS) {
		t.Fatalf("%d of %d delayed messages arrived", len(seen), len(parentTS))
	}
	t.Logf("delay child, %d messages, 2 s delay: earliest %d ms after due, latest %d ms after due (a kill -9 inside the window included)", len(seen), minLate, maxLate)
	if maxLate > 15000 {
		t.Errorf("a delayed copy came %d ms after its due time; want within a few seconds", maxLate)
	}
}

// TestSchemas: a topic's JSON Schema is checked when set and on every produce; a child
// inherits its parent's and must not carry a different one.
func TestSchemas(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	schema := map[string]any{"type": "object", "required": []string{"id"}, "properties": map[string]any{"id": map[string]any{"type": "string"}}}
	a.PostJSON("/v1/topics", map[string]any{"name": "bad", "schema": map[string]any{"type": 7}}).ExpectError(t, http.StatusBadRequest, "bad_request")
	a.createTopic("typed", map[string]any{"partitions": 1, "schema": schema})
	a.Do("POST", "/v1/topics/typed/produce", []byte(`{"id":5}`), "Content-Type", "application/json").ExpectError(t, http.StatusBadRequest, "schema_violation")
	a.Do("POST", "/v1/topics/typed/produce", []byte(`hello`), "Content-Type", "text/plain").ExpectError(t, http.StatusBadRequest, "schema_violation")
	a.PostJSON("/v1/topics/typed/produce-batch", map[string]any{"messages": []any{
		map[string]any{"payload": map[string]any{"id": "ok"}}, map[string]any{"payload": map[string]any{"nope": 1}},
	}}).ExpectError(t, http.StatusBadRequest, "schema_violation")
	if st := a.topic("typed").PartitionStats[0]; st.NextOffset != 0 {
		t.Fatalf("refused produces wrote %d messages", st.NextOffset)
	}
	a.produceJSON("typed", map[string]any{"id": "ok"}, "")
	// Children: none inherits, equal is fine, different is refused.
	a.createTopic("inherits", map[string]any{"partitions": 1, "parent": "typed"})
	a.Do("POST", "/v1/topics/inherits/produce", []byte(`{"id":1}`), "Content-Type", "application/json").ExpectError(t, http.StatusBadRequest, "schema_violation")
	a.createTopic("equal", map[string]any{"partitions": 1, "schema": schema})
	a.PostJSON("/v1/topics/typed/children", map[string]any{"child": "equal"}).Expect(t, http.StatusCreated)
	a.createTopic("different", map[string]any{"partitions": 1, "schema": map[string]any{"type": "array"}})
	a.PostJSON("/v1/topics/typed/children", map[string]any{"child": "different"}).ExpectError(t, http.StatusConflict, "conflict")
	// PATCH: a new schema applies to the next produce; {} removes it.
	a.PatchJSON("/v1/topics/different", map[string]any{"schema": map[string]any{}}).Expect(t, http.StatusOK)
	a.Do("POST", "/v1/topics/different/produce", []byte(`"anything"`), "Content-Type", "application/json").Expect(t, http.StatusAccepted)
	a.PatchJSON("/v1/topics/typed", map[string]any{"schema": map[string]any{"type": "array"}}).ExpectError(t, http.StatusConflict, "conflict")
}

// TestSchemaTakesJSONSentAsBytes: on a topic with a schema the payload's bytes decide,
// not its Content-Type: JSON sent as application/octet-stream (what older clients send),
// or base64 in a batch, that matches the schema is accepted, stored and delivered as
// JSON. A topic without a schema keeps bytes as bytes.
func TestSchemaTakesJSONSentAsBytes(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	schema := map[string]any{"type": "object", "required": []string{"id"}, "properties": map[string]any{"id": map[string]any{"type": "string"}}}
	a.createTopic("typed", map[string]any{"partitions": 1, "schema": schema})
	a.createTopic("plain", map[string]any{"partitions": 1})

	a.produce("typed", []byte(`{"id":"octet"}`), "application/octet-stream", "")
	a.PostJSON("/v1/topics/typed/produce-batch", map[string]any{"messages": []any{
		map[string]any{"payload": base64.StdEncoding.EncodeToString([]byte(`{"id":"b64"}`)), "payload_encoding": "base64"},
	}}).Expect(t, http.StatusAccepted)
	a.Do("POST", "/v1/topics/typed/produce", []byte(`{"id":5}`), "Content-Type", "application/octet-stream").ExpectError(t, http.StatusBadRequest, "schema_violation")
	a.Do("POST", "/v1/topics/typed/produce", []byte{0xff, 0x01}, "Content-Type", "application/octet-stream").ExpectError(t, http.StatusBadRequest, "schema_violation")
	a.PostJSON("/v1/topics/typed/produce-batch", map[string]any{"messages": []any{
		map[string]any{"payload": base64.StdEncoding.EncodeToString([]byte("not json")), "payload_encoding": "base64"},
	}}).ExpectError(t, http.StatusBadRequest, "schema_violation")

	want := []string{`{"id":"octet"}`, `{"id":"b64"}`}
	got := a.readAll("typed", 0)
	if len(got) != len(want) {
		t.Fatalf("typed holds %d messages, want %d", len(got), len(want))
	}
	for i, m := range got {
		if m.PayloadEncoding != "" || string(m.Payload) != want[i] {
			t.Errorf("offset %d: payload %s encoding %q, want the JSON %s", m.Offset, m.Payload, m.PayloadEncoding, want[i])
		}
	}
	if m := a.mustConsume("typed", "5s"); m.PayloadEncoding != "" || string(m.Payload) != want[0] {
		t.Errorf("consumed payload %s encoding %q, want the JSON %s", m.Payload, m.PayloadEncoding, want[0])
	}

	a.produce("plain", []byte(`{"id":"octet"}`), "application/octet-stream", "")
	if m := a.mustConsume("plain", "5s"); string(m.bytesOf(t)) != `{"id":"octet"}` {
		t.Errorf("without a schema, octet-stream came back as %s (%q)", m.Payload, m.PayloadEncoding)
	}
}

// TestFanoutLag: lag is reported per parent partition and follows the copy.
func TestFanoutLag(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("p", map[string]any{"partitions": 2})
	a.createTopic("slow", map[string]any{"partitions": 2, "parent": "p", "fanout_delay_ms": 3000})
	for i := 0; i < 10; i++ {
		a.produceJSON("p", map[string]any{"id": fmt.Sprint(i)}, "partition=0")
	}
	cs := a.children("p")
	if len(cs) != 1 || cs[0].Child != "slow" || cs[0].FanoutDelayMs != 3000 || len(cs[0].Lag) != 2 {
		t.Fatalf("children %+v", cs)
	}
	sort.Slice(cs[0].Lag, func(i, j int) bool { return cs[0].Lag[i].Partition < cs[0].Lag[j].Partition })
	if l := cs[0].Lag[0]; l.ParentNextOffset != 10 || l.Lag != 10-l.ChildCursor || l.Lag == 0 {
		t.Errorf("lag of partition 0 within the delay: %+v", l)
	}
	waitFor(t, 20*time.Second, "the delayed copy", func() bool { return a.lagOf("p", "slow") == 0 })
}
