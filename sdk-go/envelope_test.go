package narad_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"

	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	for _, body := range []any{[]byte{0, 0xff, 1}, "text", order{ID: 3}} {
		e, err := narad.NewEnvelope(body)
		if err != nil {
			t.Fatal(err)
		}
		e.SetHeader("h", "v")
		e.TraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		e.NotBefore = time.UnixMilli(1796072068780)
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var back narad.Envelope
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(body)
		if bb, ok := body.([]byte); ok {
			want = bb
		} else if s, ok := body.(string); ok {
			want = []byte(s)
		}
		if back.ID != e.ID || back.Attempt != 1 || back.Headers["h"] != "v" || back.TraceParent != e.TraceParent ||
			!back.NotBefore.Equal(e.NotBefore) || !bytes.Equal(back.Bytes(), want) {
			t.Fatalf("%T: %s -> %+v", body, b, back)
		}
		// Marshalled again, it is the same wire form.
		b2, _ := json.Marshal(&back)
		if !bytes.Equal(b, b2) {
			t.Fatalf("%s != %s", b, b2)
		}
	}
	var e narad.Envelope
	if err := json.Unmarshal([]byte(`{"id":"1","body":1}`), &e); err == nil {
		t.Fatal("a body without the format marker parsed as an envelope")
	}
}

// TestEnvelopeWireFormIsShared pins the wire form the JS and Python SDKs write.
func TestEnvelopeWireFormIsShared(t *testing.T) {
	wire := `{"format":"narad.envelope/1","id":"a1","attempt":3,"headers":{"k":"v"},"traceparent":"tp",` +
		`"not_before":1796072068780,"last_error":"boom","origin":"orders","body_text":"héllo"}`
	var e narad.Envelope
	if err := json.Unmarshal([]byte(wire), &e); err != nil {
		t.Fatal(err)
	}
	if e.ID != "a1" || e.Attempt != 3 || e.Headers["k"] != "v" || e.TraceParent != "tp" || e.LastError != "boom" ||
		e.Origin != "orders" || e.NotBefore.UnixMilli() != 1796072068780 || string(e.Bytes()) != "héllo" {
		t.Fatalf("%+v", e)
	}
	for in, want := range map[string]string{
		`{"format":"narad.envelope/1","id":"x","attempt":1,"body":{"a":[1,2]}}`:   `{"a":[1,2]}`,
		`{"format":"narad.envelope/1","id":"x","attempt":1,"body_base64":"AP8="}`: "\x00\xff",
	} {
		var e narad.Envelope
		if err := json.Unmarshal([]byte(in), &e); err != nil {
			t.Fatal(err)
		}
		got := string(e.Bytes())
		if got != want {
			t.Fatalf("%s: body %q, want %q", in, got, want)
		}
		out, _ := json.Marshal(&e)
		if string(out) != in {
			t.Fatalf("re-marshalled %s, want %s", out, in)
		}
	}
}

// TestRetryTiersThroughTiersToParking: a handler that always fails moves the message
// from the main topic through two delay tiers (each a retry topic with a delay child) to
// parking, with the same id all the way.
func TestRetryTiersThroughTiersToParking(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	base := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	tiers := narad.RetryTiers{
		Topic:   base,
		Tiers:   []narad.RetryTier{{Topic: base + ".retry1", Delay: 300 * time.Millisecond}, {Topic: base + ".retry2", Delay: 300 * time.Millisecond}},
		Parking: base + ".parking",
	}
	if err := tiers.EnsureTopics(ctx, c, narad.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Produce(ctx, base, order{ID: 42}, narad.WithKey("k42")); err != nil {
		t.Fatal(err)
	}
	type call struct {
		attempt int
		id      string
		at      time.Time
		body    string
	}
	calls := make(chan call, 10)
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- tiers.Consume(runCtx, c, func(ctx context.Context, m *narad.Message) error {
			env := m.Envelope()
			calls <- call{env.Attempt, env.ID, time.Now(), string(m.Bytes())}
			return errors.New("downstream is down")
		}, narad.WithWait(200*time.Millisecond))
	}()
	var got []call
	for len(got) < 3 {
		select {
		case cl := <-calls:
			got = append(got, cl)
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d attempts", len(got))
		}
	}
	m := receiveOne(t, c, tiers.Parking)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	env, ok := narad.OpenEnvelope(m)
	if !ok {
		t.Fatalf("parked message is not an envelope: %s", m.Bytes())
	}
	var o order
	if err := env.Decode(&o); err != nil || o.ID != 42 || env.Attempt != 3 || env.LastError != "downstream is down" ||
		env.Origin != base || env.ID != got[0].id || m.Key != "k42" {
		t.Fatalf("parked %+v key %q (%v)", env, m.Key, err)
	}
	for i, cl := range got {
		if cl.attempt != i+1 || cl.id != got[0].id || cl.body != `{"id":42,"total":0}` {
			t.Fatalf("attempt %d: %+v", i, cl)
		}
		if i > 0 && cl.at.Sub(got[i-1].at) < 250*time.Millisecond {
			t.Fatalf("attempt %d came %s after the previous, before its tier's delay", i+1, cl.at.Sub(got[i-1].at))
		}
	}
	m.Ack(ctx)
	// Nobody consumes the retry topics themselves; what was consumed is all settled.
	for _, topic := range []string{base, tiers.Tiers[0].DueTopic(), tiers.Tiers[1].DueTopic(), tiers.Parking} {
		assertEmpty(t, c, topic)
	}
}
