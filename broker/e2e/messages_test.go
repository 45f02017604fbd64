package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPayloadRoundTrip: a consumer sees the payload as it was sent: JSON verbatim,
// text as a JSON string, other bytes base64 with payload_encoding.
func TestPayloadRoundTrip(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("p", map[string]any{"partitions": 1})

	type kind int
	const (
		asJSON kind = iota
		asText
		asBytes
	)
	invalidUTF8 := []byte{'a', 0xff, 0xfe, 'b', 0xc3}
	allBytes := make([]byte, 256)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}
	cases := []struct {
		name  string
		ctype string
		body  []byte
		want  kind
	}{
		{"json object", "application/json", []byte(`{"b": [1, 2.5, "x", null, true], "a": {"n": {}}, "u": "h\u00e9"}`), asJSON},
		{"json array", "application/json; charset=utf-8", []byte(`[1,{"k":"v"}]`), asJSON},
		{"json string", "application/json", []byte(`"just a string"`), asJSON},
		{"json number", "application/vnd.example+json", []byte(`12345678901234567890`), asJSON},
		{"text", "text/plain", []byte("héllo \"wörld\"\n\ttab \\ back\u2028"), asText},
		{"text that looks like json", "text/plain; charset=utf-8", []byte(`{"not":"json to me"}`), asText},
		{"empty text", "text/plain", []byte{}, asText},
		{"octet-stream", "application/octet-stream", allBytes, asBytes},
		{"octet-stream of valid json", "application/octet-stream", []byte(`{"a":1}`), asBytes},
		{"sniffed json", "", []byte(`{"sniffed":true}`), asJSON},
		{"sniffed text", "", []byte("plain words"), asText},
		{"sniffed invalid utf-8", "", invalidUTF8, asBytes},
		{"unknown type, invalid utf-8", "image/png", invalidUTF8, asBytes},
	}
	for i, c := range cases {
		p := a.produce("p", c.body, c.ctype, "")
		if p.Offset != int64(i) || p.Partition != 0 || p.Topic != "p" {
			t.Errorf("%s: produced %+v, want offset %d", c.name, p, i)
		}
	}
	check := func(how string, m *message, want kind, body []byte, name string) {
		t.Helper()
		switch want {
		case asJSON:
			if m.PayloadEncoding != "" {
				t.Errorf("%s %s: payload_encoding %q for JSON", how, name, m.PayloadEncoding)
			}
			var got, exp any
			if err := json.Unmarshal(m.Payload, &got); err != nil {
				t.Errorf("%s %s: payload %s: %v", how, name, m.Payload, err)
			}
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.UseNumber()
			dec.Decode(&exp)
			d2 := json.NewDecoder(bytes.NewReader(m.Payload))
			d2.UseNumber()
			d2.Decode(&got)
			if !reflect.DeepEqual(got, exp) {
				t.Errorf("%s %s: payload %s, want %s", how, name, m.Payload, body)
			}
			if body[0] == '{' && (len(m.Payload) == 0 || m.Payload[0] != '{') {
				t.Errorf("%s %s: a JSON object came back as %s, not an object", how, name, m.Payload)
			}
		case asText:
			var s string
			if m.PayloadEncoding != "" || json.Unmarshal(m.Payload, &s) != nil || s != string(body) {
				t.Errorf("%s %s: payload %s (encoding %q), want the JSON string %q", how, name, m.Payload, m.PayloadEncoding, body)
			}
		case asBytes:
			if got := m.bytesOf(t); !bytes.Equal(got, body) {
				t.Errorf("%s %s: bytes %x, want %x", how, name, got, body)
			}
		}
	}
	for i, c := range cases {
		m := a.mustConsume("p", "5s")
		if m.Offset != int64(i) {
			t.Fatalf("consumed offset %d, want %d (one partition, log order)", m.Offset, i)
		}
		check("consume", m, c.want, c.body, c.name)
		a.mustAck("p", m)
	}
	replay := a.read("p", 0, "max=100")
	if len(replay.Messages) != len(cases) {
		t.Fatalf("replay returned %d messages, want %d", len(replay.Messages), len(cases))
	}
	for i, c := range cases {
		check("replay", &replay.Messages[i], c.want, c.body, c.name)
	}

	// payload_encoding=base64 turns every payload into base64 of the exact bytes.
	for i, c := range cases {
		m := a.consume("p", "partition=0&offset="+strconv.Itoa(i)+"&payload_encoding=base64")
		if m == nil {
			t.Fatalf("replay of offset %d answered 204", i)
		}
		if got := m.bytesOf(t); !bytes.Equal(got, c.body) {
			t.Errorf("base64 %s: bytes %q, want %q", c.name, got, c.body)
		}
	}
	mr := a.read("p", 0, "payload_encoding=base64")
	for i, c := range cases {
		if got := mr.Messages[i].bytesOf(t); !bytes.Equal(got, c.body) {
			t.Errorf("replay base64 %s: bytes %q, want %q", c.name, got, c.body)
		}
	}
	// And on leased consumes, one by one and in batches, of messages produced afresh.
	for _, c := range cases {
		a.produce("p", c.body, c.ctype, "")
	}
	n := int64(len(cases))
	for i := int64(0); i < 4; i++ {
		m := a.consume("p", "wait=5s&payload_encoding=base64")
		if m == nil || m.Offset != n+i || m.ReceiptHandle == "" {
			t.Fatalf("leased consume %d: %+v", i, m)
		}
		if got := m.bytesOf(t); !bytes.Equal(got, cases[i].body) {
			t.Errorf("leased base64 %s: bytes %q, want %q", cases[i].name, got, cases[i].body)
		}
	}
	r := a.Get("/v1/topics/p/consume-batch?max=100&wait=5s&payload_encoding=base64")
	var l struct {
		Messages []message `json:"messages"`
	}
	if r.Expect(t, http.StatusOK) && r.JSON(t, &l) {
		if len(l.Messages) != len(cases)-4 {
			t.Errorf("consume-batch returned %d messages, want %d", len(l.Messages), len(cases)-4)
		}
		for _, m := range l.Messages {
			c := cases[m.Offset-n]
			if got := m.bytesOf(t); !bytes.Equal(got, c.body) {
				t.Errorf("batch base64 %s: bytes %q, want %q", c.name, got, c.body)
			}
		}
	}
}

// TestProduceBatchBinaryRoundTrip: produce-batch with payload_encoding base64 stores
// the decoded bytes, and consumers get exactly them back; JSON payloads are stored
// verbatim.
func TestProduceBatchBinaryRoundTrip(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("bin", map[string]any{"partitions": 3})

	rng := rand.New(rand.NewPCG(1, 2))
	var want [][]byte
	var msgs []map[string]any
	for i := 0; i < 50; i++ {
		b := make([]byte, rng.IntN(3000))
		for j := range b {
			b[j] = byte(rng.UintN(256))
		}
		if i == 0 {
			b = []byte{} // empty
		}
		want = append(want, b)
		msgs = append(msgs, map[string]any{"payload": base64.StdEncoding.EncodeToString(b), "payload_encoding": "base64", "key": "k" + strconv.Itoa(i%7)})
	}
	msgs = append(msgs, map[string]any{"payload": map[string]any{"json": []int{1, 2}}, "partition": 2})
	r := a.PostJSON("/v1/topics/bin/produce-batch", map[string]any{"messages": msgs})
	var res struct {
		Results []produced `json:"results"`
	}
	if !r.Expect(t, http.StatusAccepted) || !r.JSON(t, &res) {
		t.FailNow()
	}
	if len(res.Results) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(res.Results), len(msgs))
	}
	if last := res.Results[len(msgs)-1]; last.Partition != 2 {
		t.Errorf("pinned message went to partition %d", last.Partition)
	}
	seen := map[string]bool{}
	for i, p := range res.Results[:len(want)] {
		where := fmt.Sprintf("%d/%d", p.Partition, p.Offset)
		if seen[where] {
			t.Errorf("two results name %s", where)
		}
		seen[where] = true
		m := a.consume("bin", "partition="+strconv.Itoa(int(p.Partition))+"&offset="+strconv.FormatInt(p.Offset, 10))
		if m == nil {
			t.Fatalf("message %d at %s not found", i, where)
		}
		if got := m.bytesOf(t); !bytes.Equal(got, want[i]) {
			t.Errorf("message %d: %d bytes back, want %d bytes (equal: false)", i, len(got), len(want[i]))
		}
		if m.Key == nil || *m.Key != "k"+strconv.Itoa(i%7) {
			t.Errorf("message %d: key %v", i, m.Key)
		}
	}
	last := res.Results[len(msgs)-1]
	m := a.consume("bin", "partition=2&offset="+strconv.FormatInt(last.Offset, 10))
	if m == nil || string(m.Payload) != `{"json":[1,2]}` || m.PayloadEncoding != "" {
		t.Errorf("JSON batch payload came back as %+v", m)
	}
	// Leased consumes see the same bytes.
	got := 0
	for _, m := range a.drain("bin") {
		got++
		if m.PayloadEncoding == "base64" {
			idx := -1
			for i, p := range res.Results {
				if p.Partition == m.Partition && p.Offset == m.Offset {
					idx = i
				}
			}
			if idx < 0 || !bytes.Equal(m.bytesOf(t), want[idx]) {
				t.Errorf("leased %s: bytes differ from what was sent", m.where())
			}
		}
	}
	if got != len(msgs) {
		t.Errorf("drained %d messages, want %d", got, len(msgs))
	}
}

// TestKeyRouting: the same key always lands in the same partition, different keys
// spread, and partition= pins.
func TestKeyRouting(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("k", map[string]any{"partitions": 8})
	where := map[string]int32{}
	used := map[int32]bool{}
	for round := 0; round < 3; round++ {
		for i := 0; i < 24; i++ {
			key := "customer-" + strconv.Itoa(i)
			p := a.produce("k", []byte("x"), "text/plain", "key="+key)
			if prev, ok := where[key]; ok && prev != p.Partition {
				t.Errorf("key %s went to partition %d, earlier to %d", key, p.Partition, prev)
			}
			where[key] = p.Partition
			used[p.Partition] = true
		}
	}
	if len(used) < 3 {
		t.Errorf("24 keys used only partitions %v of 8", used)
	}
	// Batch produce hashes the same way.
	var msgs []map[string]any
	for i := 0; i < 24; i++ {
		msgs = append(msgs, map[string]any{"payload": i, "key": "customer-" + strconv.Itoa(i)})
	}
	var res struct {
		Results []produced `json:"results"`
	}
	if r := a.PostJSON("/v1/topics/k/produce-batch", map[string]any{"messages": msgs}); r.Expect(t, http.StatusAccepted) && r.JSON(t, &res) {
		for i, p := range res.Results {
			if want := where["customer-"+strconv.Itoa(i)]; p.Partition != want {
				t.Errorf("batch: key customer-%d went to %d, single produce to %d", i, p.Partition, want)
			}
		}
	}
	// partition= pins, also over a key.
	for i := 0; i < 10; i++ {
		if p := a.produce("k", []byte("pinned"), "text/plain", "partition=5&key=customer-"+strconv.Itoa(i)); p.Partition != 5 {
			t.Errorf("partition=5 produced to %d", p.Partition)
		}
	}
	// Keys come back on consume; keyless produce takes turns over every partition.
	for _, m := range a.readAll("k", int(where["customer-3"])) {
		if m.Key == nil {
			t.Errorf("%s: key lost", m.where())
		} else if where[*m.Key] != m.Partition && m.Partition != 5 {
			t.Errorf("%s holds key %s", m.where(), *m.Key)
		}
	}
	keyless := map[int32]int{}
	for i := 0; i < 16; i++ {
		keyless[a.produce("k", []byte("rr"), "text/plain", "").Partition]++
	}
	if len(keyless) != 8 {
		t.Errorf("16 keyless messages went to %d partitions (%v), want all 8", len(keyless), keyless)
	}
}

// TestConsumeBatchAndAckBatch covers consume-batch (max, leases) and ack-batch with
// settle, extend=true, extend=<duration>, extend=0, a bad handle and a repeated one.
func TestConsumeBatchAndAckBatch(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("b", map[string]any{"partitions": 2, "visibility_timeout_ms": 60000})
	for i := 0; i < 6; i++ {
		a.produceJSON("b", map[string]any{"id": strconv.Itoa(i)}, "")
	}
	ms := a.consumeBatch("b", 4, "5s")
	for len(ms) < 4 {
		more := a.consumeBatch("b", 4-len(ms), "5s")
		if len(more) == 0 {
			t.Fatalf("got %d of 4 messages", len(ms))
		}
		ms = append(ms, more...)
	}
	if len(ms) != 4 {
		t.Fatalf("consume-batch max=4 returned %d", len(ms))
	}
	handles := map[string]bool{}
	for _, m := range ms {
		if m.ReceiptHandle == "" || m.DeliveryAttempt != 1 || handles[m.ReceiptHandle] {
			t.Errorf("%s: handle %q attempt %d", m.where(), m.ReceiptHandle, m.DeliveryAttempt)
		}
		handles[m.ReceiptHandle] = true
	}
	acks := []map[string]string{
		{"receipt_handle": ms[0].ReceiptHandle},
		{"receipt_handle": ms[1].ReceiptHandle, "extend": "true"},
		{"receipt_handle": ms[2].ReceiptHandle, "extend": "0"},
		{"receipt_handle": ms[3].ReceiptHandle, "extend": "30s"},
		{"receipt_handle": "not-a-handle"},
		{"receipt_handle": ms[0].ReceiptHandle},
		{"receipt_handle": ms[3].ReceiptHandle, "extend": "forever"},
	}
	want := []int{204, 204, 204, 204, 400, 410, 400}
	wantCode := []string{"", "", "", "", "invalid_receipt_handle", "lease_lost", "invalid_parameter"}
	r := a.PostJSON("/v1/topics/b/ack-batch", map[string]any{"acks": acks})
	var res struct {
		Results []ackResult `json:"results"`
	}
	if !r.Expect(t, http.StatusOK) || !r.JSON(t, &res) || len(res.Results) != len(acks) {
		t.Fatalf("ack-batch: %d %s", r.Status, r.Body)
	}
	for i, ar := range res.Results {
		if ar.ReceiptHandle != acks[i]["receipt_handle"] {
			t.Errorf("result %d names handle %q, want %q (request order)", i, ar.ReceiptHandle, acks[i]["receipt_handle"])
		}
		code := ""
		if ar.Error != nil {
			code = ar.Error.Code
		}
		if ar.Status != want[i] || code != wantCode[i] {
			t.Errorf("result %d (%v): status %d code %q, want %d %q", i, acks[i], ar.Status, code, want[i], wantCode[i])
		}
	}
	// The nacked one (ms[2]) is available again; the others are settled or leased.
	rest := a.drain("b")
	got := map[string]int{}
	for _, m := range rest {
		got[m.where()]++
	}
	if got[ms[2].where()] != 1 {
		t.Errorf("the nacked message %s came back %d times", ms[2].where(), got[ms[2].where()])
	}
	for _, m := range ms[:2] {
		if got[m.where()] != 0 {
			t.Errorf("settled or renewed message %s was delivered again", m.where())
		}
	}
	if got[ms[3].where()] != 0 {
		t.Errorf("message %s extended by 30 s was delivered again at once", ms[3].where())
	}
	if len(rest) != 3 { // the nacked one and the two never consumed
		t.Errorf("drained %d messages, want 3: %v", len(rest), got)
	}
	// The renewed and extended leases still settle.
	a.ack("b", ms[1].ReceiptHandle, "").Expect(t, http.StatusNoContent)
	a.ack("b", ms[3].ReceiptHandle, "").Expect(t, http.StatusNoContent)
	d := a.topic("b")
	for _, ps := range d.PartitionStats {
		if ps.Backlog != 0 || ps.InFlight != 0 || ps.AckFrontier != ps.NextOffset {
			t.Errorf("after settling everything: %+v", ps)
		}
	}
}

// TestReplay: partitions/{p}/messages returns log order with next_offset to go on,
// from/max/from_time work, and consume with partition+offset reads one message with
// no lease.
func TestReplay(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("r", map[string]any{"partitions": 2})
	const n = 25
	for i := 0; i < n; i++ {
		a.produceJSON("r", map[string]any{"id": strconv.Itoa(i)}, "partition=1")
		if i == 14 {
			// A clean gap in time between offsets 14 and 15 for from_time.
			before := time.Now().UnixMilli()
			testWaitClock(before)
		}
	}
	all := a.readAll("r", 1)
	if len(all) != n {
		t.Fatalf("replay found %d messages, want %d", len(all), n)
	}
	for i, m := range all {
		if m.Offset != int64(i) || payloadID(t, &m) != strconv.Itoa(i) || m.Partition != 1 || m.Topic != "r" {
			t.Errorf("replay[%d]: %s id %s", i, m.where(), m.Payload)
		}
		if m.ReceiptHandle != "" || m.DeliveryAttempt != 0 {
			t.Errorf("replay[%d] carries a lease: %q %d", i, m.ReceiptHandle, m.DeliveryAttempt)
		}
		if i > 0 && m.Timestamp < all[i-1].Timestamp {
			t.Errorf("timestamps go back at offset %d", i)
		}
	}
	// Paging: max and next_offset.
	var paged []message
	from := int64(0)
	for pages := 0; ; pages++ {
		mr := a.read("r", 1, "max=7&from="+strconv.FormatInt(from, 10))
		if len(mr.Messages) > 7 {
			t.Fatalf("max=7 returned %d", len(mr.Messages))
		}
		if len(mr.Messages) == 0 {
			if mr.NextOffset != n {
				t.Errorf("next_offset at the end is %d, want %d", mr.NextOffset, n)
			}
			break
		}
		if mr.Messages[0].Offset != from || mr.NextOffset != mr.Messages[len(mr.Messages)-1].Offset+1 {
			t.Errorf("page from %d: first %d, next_offset %d", from, mr.Messages[0].Offset, mr.NextOffset)
		}
		paged = append(paged, mr.Messages...)
		from = mr.NextOffset
		if pages > n {
			t.Fatal("paging does not end")
		}
	}
	if len(paged) != n {
		t.Errorf("paging read %d messages", len(paged))
	}
	if mr := a.read("r", 0, ""); len(mr.Messages) != 0 || mr.NextOffset != 0 {
		t.Errorf("empty partition: %+v", mr)
	}
	// The answer names the topic's incarnation; a read that names it is served, one
	// naming another is refused, and one that is not an incarnation is a bad request.
	inc := a.topic("r").Incarnation
	if mr := a.read("r", 1, "max=1&incarnation="+inc); mr.Incarnation != inc || len(mr.Messages) != 1 {
		t.Errorf("a read naming incarnation %s: %+v", inc, mr)
	}
	if r := a.Get("/v1/topics/r/partitions/1/messages?incarnation=" + inc + "9"); r.Status != http.StatusConflict || !strings.Contains(string(r.Body), "incarnation_mismatch") {
		t.Errorf("a read naming another incarnation: %d %s, want 409 incarnation_mismatch", r.Status, r.Body)
	}
	for _, bad := range []string{"x", "0", "-1"} {
		if r := a.Get("/v1/topics/r/partitions/1/messages?incarnation=" + bad); r.Status != http.StatusBadRequest {
			t.Errorf("incarnation=%s: %d %s, want 400", bad, r.Status, r.Body)
		}
	}
	// from_time: the first message at or after the time.
	ts := all[15].Timestamp
	mr := a.read("r", 1, "from_time="+strconv.FormatInt(ts, 10))
	if len(mr.Messages) == 0 || mr.Messages[0].Offset != 15 {
		t.Errorf("from_time=%d (offset 15's stamp) started at %+v", ts, first(mr.Messages))
	}
	rfc := time.UnixMilli(ts).UTC().Format(time.RFC3339Nano)
	mr = a.read("r", 1, "from_time="+rfc)
	if len(mr.Messages) == 0 || mr.Messages[0].Offset != 15 {
		t.Errorf("from_time=%s started at %+v", rfc, first(mr.Messages))
	}
	mr = a.read("r", 1, "from_time=2000-01-01T00:00:00Z&max=3")
	if len(mr.Messages) != 3 || mr.Messages[0].Offset != 0 {
		t.Errorf("from_time in the past: %d messages from %+v", len(mr.Messages), first(mr.Messages))
	}
	mr = a.read("r", 1, "from_time="+strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10))
	if len(mr.Messages) != 0 {
		t.Errorf("from_time in the future returned %d messages", len(mr.Messages))
	}
	// consume with partition+offset: exactly that message, no lease; 204 past the end.
	for _, off := range []int{0, 7, n - 1} {
		m := a.consume("r", "partition=1&offset="+strconv.Itoa(off))
		if m == nil || m.Offset != int64(off) || payloadID(t, m) != strconv.Itoa(off) || m.ReceiptHandle != "" || m.DeliveryAttempt != 0 {
			t.Errorf("consume partition=1 offset=%d: %+v", off, m)
		}
	}
	for _, q := range []string{"partition=1&offset=" + strconv.Itoa(n), "partition=1&offset=1000000", "partition=0&offset=0"} {
		if r := a.Get("/v1/topics/r/consume?" + q); r.Status != http.StatusNoContent {
			t.Errorf("consume %s: %d, want 204", q, r.Status)
		}
	}
	// Replay took no leases: every message is still there for consumers.
	if d := a.topic("r"); d.PartitionStats[1].InFlight != 0 || d.PartitionStats[1].Backlog != n {
		t.Errorf("replay changed the queue: %+v", d.PartitionStats[1])
	}
	if got := len(a.drain("r")); got != n {
		t.Errorf("drained %d after replays, want %d", got, n)
	}
	// Replay still reads settled messages.
	if got := len(a.readAll("r", 1)); got != n {
		t.Errorf("replay after settling found %d", got)
	}
}

func first(ms []message) any {
	if len(ms) == 0 {
		return "nothing"
	}
	return ms[0].where()
}

// testWaitClock returns once the wall clock is 5 ms past ms, so that the next message
// gets a later timestamp even from a broker clock a millisecond off ours. It waits for the clock, not for a
// state of the broker.
func testWaitClock(ms int64) {
	for time.Now().UnixMilli() <= ms+5 {
		time.Sleep(time.Millisecond)
	}
}

// TestReplayAfterRetention: when retention removed old segments, replay from below the
// oldest offset starts at the oldest, and consume of an aged-out offset is 400
// offset_out_of_range.
func TestReplayAfterRetention(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t, "--segment-bytes", "4096", "--retention-interval", "100ms")
	a.createTopic("old", map[string]any{"partitions": 1, "retention_ms": 1000})
	big := bytes.Repeat([]byte("r"), 1500)
	for i := 0; i < 8; i++ {
		a.produce("old", big, "text/plain", "")
	}
	// Retention needs the early segments' newest record to be a second old; then a
	// segment of younger records keeps the partition non-empty.
	var oldest int64
	waitFor(t, 20*time.Second, "retention to remove the first segments", func() bool {
		a.produce("old", big, "text/plain", "")
		oldest = a.topic("old").PartitionStats[0].OldestOffset
		return oldest > 0
	})
	// On a loaded machine everything may have aged out by now; oldest only grows.
	mr := a.read("old", 0, "from=0&max=5")
	if (len(mr.Messages) > 0 && mr.Messages[0].Offset < oldest) || mr.NextOffset < oldest {
		t.Errorf("replay from 0 with oldest %d started at %v (next_offset %d)", oldest, first(mr.Messages), mr.NextOffset)
	}
	a.Get("/v1/topics/old/consume?partition=0&offset=0").ExpectError(t, http.StatusBadRequest, "offset_out_of_range")
	ps := a.topic("old").PartitionStats[0]
	if ps.AckFrontier < ps.OldestOffset {
		t.Errorf("frontier %d below the oldest offset %d: aged-out messages count as settled", ps.AckFrontier, ps.OldestOffset)
	}
	if m := a.consume("old", "wait=1s"); m != nil && m.Offset < oldest {
		t.Errorf("consume with oldest offset %d delivered aged-out %s", oldest, m.where())
	}
}

// TestPayloadDepthLimit: JSON payloads nest at most 128 levels (a Python consumer's
// decoder gives up near 1,000, and deeper ones could never be settled); 128 is stored
// and served back as sent, by produce and produce-batch.
func TestPayloadDepthLimit(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("deep", map[string]any{"partitions": 1})
	at128 := strings.Repeat("[", 64) + strings.Repeat(`{"a":`, 64) + "1" + strings.Repeat("}", 64) + strings.Repeat("]", 64)
	a.produce("deep", []byte(at128), "application/json", "")
	r := a.Do("POST", "/v1/topics/deep/produce-batch", []byte(`{"messages":[{"payload":`+at128+`}]}`), "Content-Type", "application/json")
	if r.Status != http.StatusAccepted {
		t.Fatalf("a batch payload 128 deep: %d %s", r.Status, r.Body)
	}
	got := a.drain("deep")
	if len(got) != 2 {
		t.Fatalf("%d messages, want 2", len(got))
	}
	for _, m := range got {
		if string(m.Payload) != at128 {
			t.Fatalf("served %.60q, want the 128-deep payload", m.Payload)
		}
	}
	a.Do("POST", "/v1/topics/deep/produce", []byte("["+at128+"]"), "Content-Type", "application/json").ExpectError(t, http.StatusBadRequest, "invalid_payload")
}
