package narad_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// TestRetryTiersWaitingMessageHoldsNoLease: a message waiting out its tier's delay must
// not take one of the in-flight slots of any topic the tiers consume or feed. Holding it
// with a delayed nack (what RetryTiers did) kept it leased for the whole delay, so with
// max_in_flight_per_partition = 1 the tier's partition was full while it waited.
func TestRetryTiersWaitingMessageHoldsNoLease(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	cfg := narad.TopicConfig{Partitions: 1, MaxInFlightPerPartition: 1}
	base := mustTopic(t, c, cfg)
	tiers := narad.RetryTiers{
		Topic:   base,
		Tiers:   []narad.RetryTier{{Topic: base + ".retry1", Delay: 4 * time.Second}},
		Parking: base + ".parking",
	}
	if err := tiers.EnsureTopics(ctx, c, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Produce(ctx, base, "w"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var attempts []time.Time
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- tiers.Consume(runCtx, c, func(ctx context.Context, m *narad.Message) error {
			mu.Lock()
			defer mu.Unlock()
			attempts = append(attempts, time.Now())
			if len(attempts) == 1 {
				return errors.New("not yet")
			}
			return nil
		}, narad.WithWait(200*time.Millisecond))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	eventually(t, 30*time.Second, "the first attempt to fail", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) == 1
	})
	// The failed attempt is settled on the main topic once its copy is in the tier: wait
	// for that ack, or the moment between the handler's failure and it reads as a hold.
	eventually(t, 30*time.Second, "the failed original to be acked on the main topic", func() bool {
		info, err := c.Topic(ctx, base)
		return err == nil && len(info.Stats) == 1 && info.Stats[0].AckFrontier == 1
	})
	// While it waits (the tier's delay is 4 s), no topic of the tiers holds it leased.
	// Polled for a while, since the hold, when there is one, starts a moment after the
	// failure.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := len(attempts)
		mu.Unlock()
		if n > 1 {
			t.Fatal("the retry came before the tier's delay")
		}
		for _, topic := range []string{base, tiers.Tiers[0].Topic} {
			info, err := c.Topic(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range info.Stats {
				if s.InFlight != 0 {
					t.Fatalf("%s partition %d holds %d lease(s) while the message waits in its tier", topic, s.Partition, s.InFlight)
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	eventually(t, 30*time.Second, "the retry", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) == 2
	})
	mu.Lock()
	if gap := attempts[1].Sub(attempts[0]); gap < 3500*time.Millisecond {
		t.Errorf("the retry came %s after the failure, before the tier's 4 s", gap)
	}
	mu.Unlock()
}

// TestRetryTiersEarlyMessageDoesNotBlockReadyOnes: with max_in_flight_per_partition = 1,
// an envelope whose not_before is an hour away (written by another producer, or an older
// SDK) must not stop the ready message behind it. Holding it with a delayed nack filled
// the partition's only slot for the hour.
func TestRetryTiersEarlyMessageDoesNotBlockReadyOnes(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	cfg := narad.TopicConfig{Partitions: 1, MaxInFlightPerPartition: 1}
	base := mustTopic(t, c, cfg)
	tiers := narad.RetryTiers{
		Topic:   base,
		Tiers:   []narad.RetryTier{{Topic: base + ".retry1", Delay: time.Hour}},
		Parking: base + ".parking",
	}
	if err := tiers.EnsureTopics(ctx, c, cfg); err != nil {
		t.Fatal(err)
	}
	early, _ := narad.NewEnvelope("early")
	early.NotBefore = time.Now().Add(time.Hour)
	ready, _ := narad.NewEnvelope("ready")
	for _, e := range []*narad.Envelope{early, ready} {
		if _, err := c.Produce(ctx, base, e); err != nil {
			t.Fatal(err)
		}
	}
	handled := make(chan string, 4)
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- tiers.Consume(runCtx, c, func(ctx context.Context, m *narad.Message) error {
			handled <- string(m.Bytes())
			return nil
		}, narad.WithWait(200*time.Millisecond))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-handled:
	case <-time.After(30 * time.Second):
		t.Fatal("nothing was handled: the early message holds the partition's only in-flight slot")
	}
	select {
	case <-handled:
	case <-time.After(30 * time.Second):
		t.Fatal("the ready message was not handled: the early message holds the partition's only in-flight slot")
	}
}
