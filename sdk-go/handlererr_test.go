package narad_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// TestConsumerReportsHandlerErrors: an error a handler returns reaches WithErrorHandler
// (wrapping the handler's own error) and the logger, not only the nack.
func TestConsumerReportsHandlerErrors(t *testing.T) {
	logs := &recordingHandler{}
	c := newClient(t, narad.WithLogger(slog.New(logs)))
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	if _, err := c.Produce(ctxT(t), topic, "x"); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom: the payment service said no")
	var mu sync.Mutex
	var got []error
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error { return boom },
		narad.WithWait(200*time.Millisecond), narad.WithNackDelay(time.Minute),
		narad.WithErrorHandler(func(err error) {
			mu.Lock()
			got = append(got, err)
			mu.Unlock()
		}))
	stop := runConsumer(t, cs)
	eventually(t, 30*time.Second, "the handler's error to be reported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range got {
			if errors.Is(e, boom) {
				return true
			}
		}
		return false
	})
	eventually(t, 30*time.Second, "the nack", func() bool { return cs.Stats().Nacked == 1 })
	stop()
	if logs.count(slog.LevelWarn, "handler") == 0 {
		t.Fatal("the handler's error was not logged")
	}
}
