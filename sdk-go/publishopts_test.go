package narad_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	narad "github.com/narad-mq/narad/sdk-go"
)

// TestPublishHonoursContentType: bytes published as application/json travel as a JSON
// payload (the broker checks them as JSON), not as opaque base64.
func TestPublishHonoursContentType(t *testing.T) {
	c, ft := newFaultClient(t)
	var mu sync.Mutex
	var sent []byte
	ft.set(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/produce-batch") {
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			mu.Lock()
			sent = b
			mu.Unlock()
		}
		return nil, nil
	}, nil)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	p := c.Publisher(topic)
	pend, err := p.Publish(ctx, []byte(`{"a":1}`), narad.WithContentType("application/json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pend.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var req struct {
		Messages []struct {
			Payload         json.RawMessage `json:"payload"`
			PayloadEncoding *string         `json:"payload_encoding"`
		} `json:"messages"`
	}
	mu.Lock()
	defer mu.Unlock()
	if err := json.Unmarshal(sent, &req); err != nil || len(req.Messages) != 1 {
		t.Fatalf("request %s: %v", sent, err)
	}
	if m := req.Messages[0]; m.PayloadEncoding != nil || string(m.Payload) != `{"a":1}` {
		t.Fatalf("published as %s (encoding %v); want the JSON payload {\"a\":1}", m.Payload, m.PayloadEncoding)
	}
	// Bytes that are not JSON under application/json are refused before sending.
	p2 := c.Publisher(topic)
	defer p2.Close(ctx)
	if _, err := p2.Publish(ctx, []byte("not json"), narad.WithContentType("application/json")); !errors.Is(err, narad.ErrBadRequest) {
		t.Fatalf("invalid JSON under application/json: %v", err)
	}
}

// TestPublishNoDuplicates: a message published with NoDuplicates is not retried when
// its batch's reply is lost; its result is uncertain.
func TestPublishNoDuplicates(t *testing.T) {
	c, ft := newFaultClient(t)
	var batches atomic.Int32
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/produce-batch") && batches.Add(1) == 1 && err == nil {
			resp.Body.Close()
			return nil, errors.New("the reply was lost")
		}
		return resp, err
	})
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	p := c.Publisher(topic)
	defer p.Close(ctx)
	pend, err := p.Publish(ctx, "once at most", narad.NoDuplicates())
	if err != nil {
		t.Fatal(err)
	}
	_, err = pend.Wait(ctx)
	if err == nil || !narad.Uncertain(err) || batches.Load() != 1 {
		t.Fatalf("result %v (uncertain %v) after %d batch requests; want an uncertain failure after one", err, narad.Uncertain(err), batches.Load())
	}
}

// TestDecodeErrorIsNotABrokerError: a body that does not decode is the application's
// problem, not a 400 from the broker.
func TestDecodeErrorIsNotABrokerError(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	if _, err := c.Produce(ctx, topic, "plain text"); err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Receive(ctx, topic)
	if err != nil || len(msgs) != 1 {
		t.Fatal(len(msgs), err)
	}
	var v map[string]any
	err = msgs[0].Decode(&v)
	var syn *json.SyntaxError
	if err == nil || errors.Is(err, narad.ErrBadRequest) || !errors.Is(err, narad.ErrDecode) || !errors.As(err, &syn) {
		t.Fatalf("Decode = %v; want ErrDecode wrapping the JSON error, not ErrBadRequest", err)
	}
	var ne *narad.Error
	if errors.As(err, &ne) {
		t.Fatalf("Decode's error is a *narad.Error (%v), which reads as a broker answer", ne)
	}
}
