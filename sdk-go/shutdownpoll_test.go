package narad_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// heldBody holds a response body until released, then fails the read as the transport
// would if the request's context is done by then. It closes reading when the client
// first reads it: the client has the answer's headers by then.
type heldBody struct {
	req     *http.Request
	body    io.ReadCloser
	release <-chan struct{}
	reading chan struct{}
	once    sync.Once
}

func (h *heldBody) Read(p []byte) (int, error) {
	h.once.Do(func() { close(h.reading) })
	<-h.release
	if err := h.req.Context().Err(); err != nil {
		return 0, err
	}
	return h.body.Read(p)
}

func (h *heldBody) Close() error { return h.body.Close() }

// TestConsumerHandsBackAPollCutByShutdown: a consumer is shut down while the answer of
// its poll, which leased a message, is arriving. The message is handed back at once
// rather than left leased until the visibility timeout.
func TestConsumerHandsBackAPollCutByShutdown(t *testing.T) {
	ft := &faultTransport{next: http.DefaultTransport.(*http.Transport).Clone()}
	c := newClient(t, narad.WithHTTPClient(&http.Client{Transport: ft}))
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1, VisibilityTimeout: 2 * time.Minute})
	if _, err := c.Produce(ctx, topic, "cut"); err != nil {
		t.Fatal(err)
	}
	// The shutdown begins once the client reads the answer's body, not when the
	// transport has its headers: until the client's Do returns, a shutdown cancels
	// the request as one whose answer has not come (that window is not this test's).
	arrived := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if err == nil && strings.HasSuffix(r.URL.Path, "/consume") && resp.StatusCode == 200 {
			once.Do(func() {
				resp.Body = &heldBody{req: r, body: resp.Body, release: release, reading: arrived}
			})
		}
		return resp, err
	})
	handled := make(chan struct{}, 1)
	cs := c.Consumer(topic, func(context.Context, *narad.Message) error { handled <- struct{}{}; return nil },
		narad.WithWait(5*time.Second))
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cs.Run(runCtx) }()
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the poll's answer never arrived")
	}
	cancel() // shutdown begins while the answer is being read
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("Run did not return")
	}
	if len(handled) != 0 {
		t.Fatal("the handler ran after shutdown began")
	}
	if s := cs.Stats(); s.Nacked != 1 {
		t.Fatalf("stats %+v: the message of the cut poll was not handed back", s)
	}
	plain := newClient(t)
	msgs, err := plain.Receive(ctx, topic, narad.WithWait(5*time.Second))
	if err != nil || len(msgs) != 1 || msgs[0].DeliveryAttempt != 2 {
		t.Fatalf("receive after shutdown: %d messages, %v; want the message back at once", len(msgs), err)
	}
}
