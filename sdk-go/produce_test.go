package narad_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

type order struct {
	ID    int     `json:"id"`
	Total float64 `json:"total"`
}

func TestProduceBodiesRoundTripExactly(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})

	allBytes := make([]byte, 256)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}
	random := make([]byte, 64<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	bodies := []struct {
		name string
		body any
		want []byte
	}{
		{"binary", allBytes, allBytes},
		{"random", random, random},
		{"empty", []byte{}, []byte{}},
		{"text", "héllo wörld\n", []byte("héllo wörld\n")},
		{"invalid-utf8-string", string([]byte{0xff, 0xfe, 'a'}), []byte{0xff, 0xfe, 'a'}},
		{"json-looking-bytes", []byte(`{"a": 1}`), []byte(`{"a": 1}`)},
		{"raw-json", json.RawMessage(`{"a" : [1, 2]}`), []byte(`{"a" : [1, 2]}`)},
		{"struct", order{ID: 7, Total: 9.5}, []byte(`{"id":7,"total":9.5}`)},
	}
	for _, b := range bodies {
		p, err := c.Produce(ctx, topic, b.body)
		if err != nil {
			t.Fatalf("%s: produce: %v", b.name, err)
		}
		if p.Topic != topic || p.Partition != 0 {
			t.Fatalf("%s: produced %+v", b.name, p)
		}
	}
	for _, b := range bodies {
		msgs, err := c.Receive(ctx, topic, narad.WithWait(5*time.Second))
		if err != nil || len(msgs) != 1 {
			t.Fatalf("%s: receive: %v %d", b.name, err, len(msgs))
		}
		m := msgs[0]
		if !bytes.Equal(m.Bytes(), b.want) {
			t.Fatalf("%s: got %q, want %q", b.name, m.Bytes(), b.want)
		}
		if m.ReceiptHandle == "" || m.DeliveryAttempt != 1 || m.Timestamp.IsZero() {
			t.Fatalf("%s: message metadata %+v", b.name, m)
		}
		if b.name == "struct" {
			var o order
			if err := m.Decode(&o); err != nil || o.ID != 7 || o.Total != 9.5 {
				t.Fatalf("decode: %v %+v", err, o)
			}
		}
		if err := m.Ack(ctx); err != nil {
			t.Fatalf("%s: ack: %v", b.name, err)
		}
	}
}

func TestProduceKeyAndPartition(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 4})
	first, err := c.Produce(ctx, topic, "a", narad.WithKey("customer-7"))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		p, err := c.Produce(ctx, topic, "b", narad.WithKey("customer-7"))
		if err != nil || p.Partition != first.Partition {
			t.Fatalf("same key, partition %d then %d (%v)", first.Partition, p.Partition, err)
		}
	}
	p, err := c.Produce(ctx, topic, "c", narad.WithPartition(3), narad.WithKey("customer-7"))
	if err != nil || p.Partition != 3 {
		t.Fatalf("pinned partition: %+v %v", p, err)
	}
	p, err = c.Produce(ctx, topic, []byte("x"), narad.WithContentType("application/json"))
	var e *narad.Error
	if !errors.As(err, &e) || e.Status != 400 || e.Code != "invalid_payload" || !errors.Is(err, narad.ErrBadRequest) || narad.Retryable(err) {
		t.Fatalf("bad JSON body: %+v %v", p, err)
	}
	msgs, err := c.Receive(ctx, topic, narad.WithMaxMessages(10), narad.WithWait(2*time.Second))
	if err != nil || len(msgs) == 0 {
		t.Fatalf("receive: %v", err)
	}
	for _, m := range msgs {
		if m.Partition != 3 && m.Key != "customer-7" {
			t.Fatalf("key not carried: %+v", m)
		}
	}
}

func TestProduceTooLargeAndMissingTopic(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	_, err := c.Produce(ctx, "no-such-topic-x", "hi")
	var e *narad.Error
	if !errors.As(err, &e) || !errors.Is(err, narad.ErrNotFound) || e.Code != "topic_not_found" || e.Op != "produce" || e.Node != shared.url || e.Topic != "no-such-topic-x" {
		t.Fatalf("missing topic: %#v", err)
	}
	if narad.Retryable(err) || narad.Uncertain(err) {
		t.Fatalf("404 must be neither retryable nor uncertain: %v", err)
	}
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	_, err = c.Produce(ctx, topic, make([]byte, narad.MaxMessageBytes+1))
	if !errors.Is(err, narad.ErrTooLarge) {
		t.Fatalf("too large: %v", err)
	}
}

func TestProduceBatchResultPerMessage(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 2})
	bin := []byte{0, 1, 2, 0xff}
	msgs := []narad.Outgoing{
		{Body: bin, Partition: narad.Pin(1)},
		{Body: "text", Key: "k"},
		{Body: order{ID: 1}},
		{Body: make(chan int)}, // cannot be encoded: fails alone
		{Body: json.RawMessage(`[1,2,3]`), Partition: narad.Pin(0)},
	}
	res, err := c.ProduceBatch(ctx, topic, msgs)
	if err == nil || len(res) != len(msgs) {
		t.Fatalf("want a partial failure, got %v (%d results)", err, len(res))
	}
	for i, r := range res {
		if (i == 3) != (r.Err != nil) {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	if !errors.Is(res[3].Err, narad.ErrBadRequest) || res[0].Partition != 1 || res[4].Partition != 0 {
		t.Fatalf("results %+v", res)
	}
	// Each stored message reads back as its exact bytes.
	want := map[[2]int64][]byte{
		{int64(res[0].Partition), res[0].Offset}: bin,
		{int64(res[1].Partition), res[1].Offset}: []byte("text"),
		{int64(res[2].Partition), res[2].Offset}: []byte(`{"id":1,"total":0}`),
		{int64(res[4].Partition), res[4].Offset}: []byte(`[1,2,3]`),
	}
	got := 0
	for m, err := range c.Replay(ctx, topic, narad.FromStart()) {
		if err != nil {
			t.Fatal(err)
		}
		w, ok := want[[2]int64{int64(m.Partition), m.Offset}]
		if !ok || !bytes.Equal(w, m.Bytes()) {
			t.Fatalf("p%d@%d = %q, want %q", m.Partition, m.Offset, m.Bytes(), w)
		}
		got++
	}
	if got != 4 {
		t.Fatalf("replayed %d messages, want 4", got)
	}
}

func TestProduceBatchSplitsOverLimits(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	msgs := make([]narad.Outgoing, 2500)
	for i := range msgs {
		msgs[i] = narad.Outgoing{Body: []byte{byte(i), byte(i >> 8)}}
	}
	var requests int
	c2 := newClient(t, narad.WithObserver(func(e narad.Event) {
		if e.Kind == narad.EventRequest && e.Op == "produce-batch" {
			requests++
		}
	}))
	res, err := c2.ProduceBatch(ctx, topic, msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Offset != int64(i) {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	if requests != 3 {
		t.Fatalf("%d requests for 2500 messages, want 3", requests)
	}
	// A batch the broker refuses whole reports every message as failed.
	bad := []narad.Outgoing{{Body: "a"}, {Body: "b"}}
	res, err = c.ProduceBatch(ctx, "no-such-topic-y", bad)
	if err == nil || res[0].Err == nil || res[1].Err == nil || !errors.Is(err, narad.ErrNotFound) {
		t.Fatalf("missing topic: %v %+v", err, res)
	}
}
