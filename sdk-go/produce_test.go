package narad_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync/atomic"
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

// TestProduceBatchPartlyStoredIsNotResent: a produce-batch answered with partly_stored
// (some partitions' writes succeeded) is never sent again, with or without
// NoDuplicates, by ProduceBatch or a Publisher: resending it stores the stored part
// twice. Every message of the request fails with an error that says so (PartlyStored:
// how many were stored, which partitions were not), Uncertain and not Retryable. The old
// code read only code and message, resent the batch like any 503 and reported success.
func TestProduceBatchPartlyStoredIsNotResent(t *testing.T) {
	c, ft := newFaultClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 2})
	const partly = `{"error":{"code":"%s","message":"a disk write failed and only part of the batch was stored",` +
		`"partly_stored":{"stored":1,"failed_partitions":[1]}}}`
	var sent atomic.Int32
	ft.set(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/produce-batch") {
			io.Copy(io.Discard, r.Body)
			// Only the first request is answered so: a resend would reach the broker.
			if sent.Add(1) == 1 {
				return answer(503, "0", fmt.Sprintf(partly, "storage_failed")), nil
			}
		}
		return nil, nil
	}, nil)
	batch := []narad.Outgoing{{Body: "a", Partition: narad.Pin(0)}, {Body: "b", Partition: narad.Pin(1)}}
	check := func(what string, errs ...error) {
		t.Helper()
		for _, err := range errs {
			var e *narad.Error
			if !errors.As(err, &e) || e.PartlyStored == nil || e.PartlyStored.Stored != 1 ||
				len(e.PartlyStored.FailedPartitions) != 1 || e.PartlyStored.FailedPartitions[0] != 1 {
				t.Fatalf("%s: the error does not say what was stored: %v", what, err)
			}
			if !narad.Uncertain(err) || narad.Retryable(err) || !strings.Contains(err.Error(), "partly stored") {
				t.Fatalf("%s: %v (uncertain %v, retryable %v)", what, err, narad.Uncertain(err), narad.Retryable(err))
			}
		}
		if n := sent.Load(); n != 1 {
			t.Fatalf("%s: the partly stored batch was sent %d times", what, n)
		}
		sent.Store(0)
	}
	for _, opts := range [][]narad.ProduceOption{nil, {narad.NoDuplicates()}} {
		res, err := c.ProduceBatch(ctx, topic, batch, opts...)
		check(fmt.Sprintf("ProduceBatch (%d options)", len(opts)), err, res[0].Err, res[1].Err)
		if !errors.Is(err, narad.ErrUnavailable) {
			t.Fatalf("503 storage_failed: %v", err)
		}
	}
	p := c.Publisher(topic, narad.WithLinger(time.Minute)) // one batch, sent by Close
	r1, _ := p.Publish(ctx, "a", narad.WithPartition(0))
	r2, _ := p.Publish(ctx, "b", narad.WithPartition(1))
	if err := p.Close(ctx); err == nil {
		t.Fatal("Publisher: the partly stored batch was reported stored")
	}
	_, err1 := r1.Wait(ctx)
	_, err2 := r2.Wait(ctx)
	check("Publisher", err1, err2)
	// With code timeout the failed partitions' messages may be stored too; the error
	// says so.
	ft.set(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/produce-batch") {
			io.Copy(io.Discard, r.Body)
			if sent.Add(1) == 1 {
				return answer(503, "0", fmt.Sprintf(partly, "timeout")), nil
			}
		}
		return nil, nil
	}, nil)
	_, err := c.ProduceBatch(ctx, topic, batch)
	check("ProduceBatch, code timeout", err)
	if !errors.Is(err, narad.ErrTimeout) || !strings.Contains(err.Error(), "may be stored") {
		t.Fatalf("code timeout: %v", err)
	}
	// Nothing reached the broker: none of the answers above was followed by a resend.
	ft.set(nil, nil)
	for m, err := range c.Replay(ctx, topic, narad.FromStart()) {
		t.Fatalf("stored by a resend: %v %v", m, err)
	}
}

// TestProduceBatchRefusesOnlyTheOversizedMessage: a message over the broker's 1 MiB
// limit fails alone with ErrTooLarge before anything is sent, and the other messages of
// the batch are stored (a message of exactly 1 MiB is within the limit). The old code
// held each message to the 7 MiB batch budget, sent the 2 MiB one, and the broker's 413
// for the whole request failed every message with it.
func TestProduceBatchRefusesOnlyTheOversizedMessage(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	res, err := c.ProduceBatch(ctx, topic, []narad.Outgoing{
		{Body: "small-1"}, {Body: make([]byte, 2<<20)}, {Body: make([]byte, narad.MaxMessageBytes)}, {Body: "small-2"}})
	if !errors.Is(err, narad.ErrTooLarge) || !errors.Is(res[1].Err, narad.ErrTooLarge) {
		t.Fatalf("the 2 MiB message: %v (batch err %v)", res[1].Err, err)
	}
	for _, i := range []int{0, 2, 3} {
		if res[i].Err != nil {
			t.Fatalf("message %d failed with the 2 MiB one: %v", i, res[i].Err)
		}
	}
	if res[0].Offset != 0 || res[2].Offset != 1 || res[3].Offset != 2 {
		t.Fatalf("results %+v", res)
	}
}

// answerFirstProduce lets the first produce through ft reach the broker (and be
// stored), then replaces the broker's answer with status and body; it counts the
// produces sent (reset it to count again).
func answerFirstProduce(ft *faultTransport, status int, contentType, body string) *atomic.Int32 {
	var sent atomic.Int32
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if err == nil && strings.HasSuffix(r.URL.Path, "/produce") && sent.Add(1) == 1 {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {contentType}},
				Body: io.NopCloser(strings.NewReader(body))}, nil
		}
		return resp, err
	})
	return &sent
}

// TestProduce408IsUncertain: a 408 (a proxy or server that gave up waiting for the
// request) is a timeout: retryable, and the produce may have been stored, so with
// NoDuplicates it is not sent again and fails as uncertain. The old code took a 408 for
// an answer that stored nothing and sent the message again, storing it twice.
func TestProduce408IsUncertain(t *testing.T) {
	c, ft := newFaultClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	// Stored, but the answer that comes back is a proxy's 408.
	sent := answerFirstProduce(ft, http.StatusRequestTimeout, "text/html", "<html><body>408 Request Time-out</body></html>")
	_, err := c.Produce(ctx, topic, "once", narad.NoDuplicates())
	if !errors.Is(err, narad.ErrTimeout) || !narad.Uncertain(err) || !narad.Retryable(err) {
		t.Fatalf("408: %v (uncertain %v, retryable %v)", err, narad.Uncertain(err), narad.Retryable(err))
	}
	if n := sent.Load(); n != 1 {
		t.Fatalf("NoDuplicates: a produce answered 408 was sent %d times", n)
	}
}

// TestProduceAnsweredMaybeStoredIsUncertain: a 503 maybe_stored (a disk write failed
// and the broker could not take it back, so the message may be found stored after the
// node restarts) is uncertain: with NoDuplicates it is not sent again. The broker once
// answered it as storage_failed, a refusal that stored nothing, and the SDK resent it.
func TestProduceAnsweredMaybeStoredIsUncertain(t *testing.T) {
	c, ft := newFaultClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	sent := answerFirstProduce(ft, http.StatusServiceUnavailable, "application/json",
		`{"error":{"code":"maybe_stored","message":"a disk write failed and the broker could not undo it"}}`)
	_, err := c.Produce(ctx, topic, "once", narad.NoDuplicates())
	var e *narad.Error
	if !errors.As(err, &e) || e.Code != narad.CodeMaybeStored || !narad.Uncertain(err) || !narad.Retryable(err) {
		t.Fatalf("503 maybe_stored: %v (uncertain %v, retryable %v)", err, narad.Uncertain(err), narad.Retryable(err))
	}
	if n := sent.Load(); n != 1 {
		t.Fatalf("NoDuplicates: a produce answered 503 maybe_stored was sent %d times", n)
	}
	sent.Store(0)
	if _, err := c.Produce(ctx, topic, "twice"); err != nil || sent.Load() != 2 {
		t.Fatalf("duplicates allowed: %v after %d sends, want stored at the second", err, sent.Load())
	}
}

// TestProduceAnsweredByAProxysBadGatewayIsUncertain: a 502 (or a 503 without the
// broker's error body) is a proxy's answer, not the broker's: the proxy may have sent the
// produce on and lost the broker's reply (nginx's "upstream prematurely closed
// connection"), so the message may be stored. With NoDuplicates it is not sent again and
// fails as uncertain. The old code took it for a refusal that stored nothing and sent
// the message again, storing it twice.
func TestProduceAnsweredByAProxysBadGatewayIsUncertain(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
	}{
		{http.StatusBadGateway, "<html><body>502 Bad Gateway</body></html>"},
		{http.StatusBadGateway, `{"error":{"code":"unavailable","message":"upstream reset"}}`},
		{http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers"},
	} {
		c, ft := newFaultClient(t)
		ctx := ctxT(t)
		topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
		// Stored, but the answer that comes back is the proxy's.
		sent := answerFirstProduce(ft, tc.status, "text/html", tc.body)
		_, err := c.Produce(ctx, topic, "once", narad.NoDuplicates())
		if !narad.Uncertain(err) || !narad.Retryable(err) {
			t.Fatalf("%d %q: %v (uncertain %v, retryable %v)", tc.status, tc.body, err, narad.Uncertain(err), narad.Retryable(err))
		}
		if n := sent.Load(); n != 1 {
			t.Fatalf("NoDuplicates: a produce answered %d by a proxy was sent %d times", tc.status, n)
		}
		// Duplicates allowed: retried, and stored (here a second time).
		sent.Store(0)
		if _, err := c.Produce(ctx, topic, "twice"); err != nil || sent.Load() != 2 {
			t.Fatalf("%d, duplicates allowed: %v after %d sends", tc.status, err, sent.Load())
		}
	}
}

// TestProduceBatchErrorSaysPartOfTheCallWasStored: a ProduceBatch sent in several
// requests (over 1000 messages) whose second request failed with a 503 that stored
// nothing. The first request's messages are stored, so the call as a whole took effect:
// its error must not say "retryable, certain", which invites sending the whole batch
// again and storing the first 1000 twice (with NoDuplicates too). The old code gave the
// joined error the flags of the first failure: Retryable true, Uncertain false.
func TestProduceBatchErrorSaysPartOfTheCallWasStored(t *testing.T) {
	c, ft := newFaultClient(t, narad.WithRetry(narad.RetryPolicy{Attempts: 1}))
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	var requests atomic.Int32
	ft.set(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/produce-batch") && requests.Add(1) == 2 {
			return unavailable(""), nil
		}
		return nil, nil
	}, nil)
	msgs := make([]narad.Outgoing, 1500)
	for i := range msgs {
		msgs[i] = narad.Outgoing{Body: "m"}
	}
	res, err := c.ProduceBatch(ctx, topic, msgs, narad.NoDuplicates())
	if err == nil {
		t.Fatal("no error")
	}
	if res[0].Err != nil || res[1499].Err == nil || !narad.Retryable(res[1499].Err) {
		t.Fatalf("per message: first %v, last %v", res[0].Err, res[1499].Err)
	}
	if narad.Retryable(err) || !narad.Uncertain(err) {
		t.Fatalf("1000 of 1500 stored, yet the call's error says retryable %v, uncertain %v: %v",
			narad.Retryable(err), narad.Uncertain(err), err)
	}
	if !errors.Is(err, narad.ErrUnavailable) {
		t.Fatalf("the failure's kind is lost: %v", err)
	}
}

// TestProduceAnswered202UnreadablyIsUncertain: a 202 says the messages are stored. When
// its body cannot be read (not JSON, or fewer results than messages: a broken proxy, a
// bug), the SDK cannot say where they went, but it must not say they were not stored:
// the error is uncertain, as the TypeScript SDK reports a short result list. The old
// code reported a certain ErrInternal, inviting a resend that stores them twice.
func TestProduceAnswered202UnreadablyIsUncertain(t *testing.T) {
	c, ft := newFaultClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if err != nil || !strings.Contains(r.URL.Path, "/produce") {
			return resp, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		body := "<html>stored, but this is not JSON</html>"
		if strings.HasSuffix(r.URL.Path, "/produce-batch") {
			body = `{"results":[]}`
		}
		resp.Body = io.NopCloser(strings.NewReader(body))
		return resp, nil
	})
	_, err := c.Produce(ctx, topic, "x", narad.NoDuplicates())
	if err == nil || !narad.Uncertain(err) || narad.Retryable(err) {
		t.Fatalf("produce answered 202 unreadably: %v (uncertain %v)", err, narad.Uncertain(err))
	}
	res, err := c.ProduceBatch(ctx, topic, []narad.Outgoing{{Body: "a"}, {Body: "b"}}, narad.NoDuplicates())
	if err == nil || !narad.Uncertain(err) || !narad.Uncertain(res[0].Err) {
		t.Fatalf("produce-batch answered 202 with no results: %v (uncertain %v)", err, narad.Uncertain(err))
	}
}
