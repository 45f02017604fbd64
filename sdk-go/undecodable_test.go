package narad_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// TestConsumerSettlesWhatItCannotDecode: a message whose body no JSON decoder takes
// (nested deeper than encoding/json's limit, as a broker before the depth limit
// stored, or bytes that are not JSON at all) still reaches the handler, Decode says
// ErrDecode, and the message is acked: one poison body must not wedge a consumer.
func TestConsumerSettlesWhatItCannotDecode(t *testing.T) {
	c := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	bodies := []string{deep, "{not json", "\xff\xfe"}
	for _, b := range bodies {
		// As bytes: the broker keeps the depth limit for JSON payloads only.
		if _, err := c.Produce(ctxT(t), topic, []byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	var decodeErrs, handled atomic.Int32
	cs := c.Consumer(topic, func(ctx context.Context, m *narad.Message) error {
		var v any
		if err := m.Decode(&v); errors.Is(err, narad.ErrDecode) {
			decodeErrs.Add(1)
		}
		handled.Add(1)
		return nil // acked
	})
	stop := runConsumer(t, cs)
	deadline := time.Now().Add(60 * time.Second)
	for {
		info, err := c.Topic(ctxT(t), topic)
		if err != nil {
			t.Fatal(err)
		}
		if info.Stats[0].AckFrontier == int64(len(bodies)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s: frontier %d, handled %d, want every one of %d undecodable messages acked", info.Stats[0].AckFrontier, handled.Load(), len(bodies))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if decodeErrs.Load() != int32(len(bodies)) {
		t.Errorf("Decode answered ErrDecode %d times, want %d", decodeErrs.Load(), len(bodies))
	}
}
