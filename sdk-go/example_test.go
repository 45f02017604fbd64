package narad_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// endpoint is where the examples find a broker: $NARAD_URL (the package's tests point it
// at the node they start), else the default local node of `make run`.
func endpoint() string {
	if u := os.Getenv("NARAD_URL"); u != "" {
		return u
	}
	return "http://127.0.0.1:7942"
}

// Produce a message, take it under a lease, and ack it.
func Example() {
	ctx := context.Background()
	c, err := narad.New([]string{endpoint()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if _, err := c.CreateTopic(ctx, "ex-orders", narad.TopicConfig{Partitions: 1}); err != nil {
		log.Fatal(err)
	}
	defer c.DeleteTopic(ctx, "ex-orders")

	if _, err := c.Produce(ctx, "ex-orders", map[string]any{"id": 1, "total": 9.5}); err != nil {
		log.Fatal(err)
	}
	msgs, err := c.Receive(ctx, "ex-orders", narad.WithWait(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range msgs {
		var o struct {
			ID    int     `json:"id"`
			Total float64 `json:"total"`
		}
		if err := m.Decode(&o); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("order %d: %.2f\n", o.ID, o.Total)
		if err := m.Ack(ctx); err != nil {
			log.Fatal(err)
		}
	}
	// Output: order 1: 9.50
}

func ExampleClient_Produce() {
	ctx := context.Background()
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()
	c.CreateTopic(ctx, "ex-produce", narad.TopicConfig{Partitions: 4})
	defer c.DeleteTopic(ctx, "ex-produce")

	// Bytes go as they are; the same key always lands in the same partition.
	a, err := c.Produce(ctx, "ex-produce", []byte{0xde, 0xad}, narad.WithKey("customer-7"))
	if err != nil {
		log.Fatal(err)
	}
	b, _ := c.Produce(ctx, "ex-produce", "more for the same customer", narad.WithKey("customer-7"))
	fmt.Println(a.Partition == b.Partition, b.Offset)
	// Output: true 1
}

func ExampleClient_ProduceBatch() {
	ctx := context.Background()
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()
	c.CreateTopic(ctx, "ex-batch", narad.TopicConfig{Partitions: 1})
	defer c.DeleteTopic(ctx, "ex-batch")

	res, err := c.ProduceBatch(ctx, "ex-batch", []narad.Outgoing{
		{Body: "first"},
		{Body: []byte{1, 2, 3}, Key: "k"},
		{Body: map[string]int{"n": 3}},
	})
	if err != nil {
		log.Fatal(err) // some messages failed: each result says which
	}
	for _, r := range res {
		fmt.Println(r.Partition, r.Offset, r.Err)
	}
	// Output:
	// 0 0 <nil>
	// 0 1 <nil>
	// 0 2 <nil>
}

func ExampleClient_Publisher() {
	ctx := context.Background()
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()
	c.CreateTopic(ctx, "ex-publisher", narad.TopicConfig{Partitions: 1})
	defer c.DeleteTopic(ctx, "ex-publisher")

	p := c.Publisher("ex-publisher", narad.WithBatchCount(100), narad.WithLinger(5*time.Millisecond))
	var pending []*narad.Pending
	for i := 0; i < 3; i++ {
		r, err := p.Publish(ctx, fmt.Sprintf("event %d", i))
		if err != nil {
			log.Fatal(err)
		}
		pending = append(pending, r)
	}
	if err := p.Close(ctx); err != nil { // sends what is buffered
		log.Fatal(err)
	}
	for _, r := range pending {
		at, err := r.Wait(ctx)
		fmt.Println(at.Offset, err)
	}
	// Output:
	// 0 <nil>
	// 1 <nil>
	// 2 <nil>
}

func ExampleClient_Receive() {
	ctx := context.Background()
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()
	c.CreateTopic(ctx, "ex-receive", narad.TopicConfig{Partitions: 1})
	defer c.DeleteTopic(ctx, "ex-receive")
	c.Produce(ctx, "ex-receive", "a")
	c.Produce(ctx, "ex-receive", "b")

	msgs, err := c.Receive(ctx, "ex-receive", narad.WithMaxMessages(10), narad.WithWait(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	results, err := c.AckBatch(ctx, "ex-receive", msgs)
	if err != nil {
		log.Print(err) // a partial failure: see each result
	}
	for _, r := range results {
		fmt.Println(string(r.Message.Bytes()), r.Err)
	}
	// Output:
	// a <nil>
	// b <nil>
}

func ExampleClient_Consume() {
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()
	bg := context.Background()
	c.CreateTopic(bg, "ex-consume", narad.TopicConfig{Partitions: 1})
	defer c.DeleteTopic(bg, "ex-consume")
	c.Produce(bg, "ex-consume", "job 1")

	ctx, stop := context.WithCancel(bg)
	err := c.Consume(ctx, "ex-consume", func(ctx context.Context, m *narad.Message) error {
		fmt.Println("handling", string(m.Bytes()))
		stop() // a service would run until shutdown; Consume drains, acks, then returns
		return nil
	}, narad.WithConcurrency(8), narad.WithWait(time.Second))
	fmt.Println("stopped:", err)
	// Output:
	// handling job 1
	// stopped: <nil>
}

func ExampleNackAfter() {
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()
	bg := context.Background()
	c.CreateTopic(bg, "ex-nack", narad.TopicConfig{Partitions: 1})
	defer c.DeleteTopic(bg, "ex-nack")
	c.Produce(bg, "ex-nack", "flaky")

	ctx, stop := context.WithCancel(bg)
	c.Consume(ctx, "ex-nack", func(ctx context.Context, m *narad.Message) error {
		fmt.Println("attempt", m.DeliveryAttempt)
		if m.DeliveryAttempt == 1 {
			// Hand it back, to be delivered again in 100 ms.
			return narad.NackAfter(errors.New("not yet"), 100*time.Millisecond)
		}
		stop()
		return nil
	}, narad.WithWait(time.Second))
	// Output:
	// attempt 1
	// attempt 2
}

func ExampleClient_Replay() {
	ctx := context.Background()
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()
	c.CreateTopic(ctx, "ex-replay", narad.TopicConfig{Partitions: 1})
	defer c.DeleteTopic(ctx, "ex-replay")
	for _, s := range []string{"a", "b", "c"} {
		c.Produce(ctx, "ex-replay", s)
	}

	// Read two, keeping the position; later, resume from it.
	var pos narad.Position
	for m, err := range c.Replay(ctx, "ex-replay", narad.FromStart()) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("first pass", string(m.Bytes()))
		pos.Advance(m)
		if m.Offset == 1 {
			break
		}
	}
	for m, err := range c.Replay(ctx, "ex-replay", pos) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("resumed", string(m.Bytes()))
	}
	// Output:
	// first pass a
	// first pass b
	// resumed c
}

func ExampleRetryTiers() {
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()
	bg := context.Background()
	tiers := narad.RetryTiers{
		Topic:   "ex-payments",
		Tiers:   []narad.RetryTier{{Topic: "ex-payments.retry-100ms", Delay: 100 * time.Millisecond}},
		Parking: "ex-payments.parking",
	}
	if err := tiers.EnsureTopics(bg, c, narad.TopicConfig{Partitions: 1}); err != nil {
		log.Fatal(err)
	}
	defer func() {
		for _, t := range []string{"ex-payments", "ex-payments.retry-100ms.due", "ex-payments.retry-100ms", "ex-payments.parking"} {
			c.DeleteTopic(bg, t)
		}
	}()
	c.Produce(bg, "ex-payments", "charge 42")

	ctx, stop := context.WithCancel(bg)
	go func() {
		// Whatever failed every tier lands in parking, with its last error.
		msgs, _ := c.Receive(bg, "ex-payments.parking", narad.WithWait(10*time.Second))
		for _, m := range msgs {
			env, _ := narad.OpenEnvelope(m)
			fmt.Printf("parked %q after attempt %d: %s\n", env.Bytes(), env.Attempt, env.LastError)
			m.Ack(bg)
		}
		stop()
	}()
	tiers.Consume(ctx, c, func(ctx context.Context, m *narad.Message) error {
		fmt.Println("attempt", m.Envelope().Attempt)
		return errors.New("card declined")
	}, narad.WithWait(time.Second))
	// Output:
	// attempt 1
	// attempt 2
	// parked "charge 42" after attempt 2: card declined
}

func ExampleRetryable() {
	ctx := context.Background()
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()

	_, err := c.Produce(ctx, "ex-no-such-topic", "x")
	var e *narad.Error
	if errors.As(err, &e) {
		fmt.Println(e.Status, e.Code, e.Op)
	}
	fmt.Println(errors.Is(err, narad.ErrNotFound), narad.Retryable(err), narad.Uncertain(err))
	// Output:
	// 404 topic_not_found produce
	// true false false
}

func ExampleClient_CreateChild() {
	ctx := context.Background()
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()

	// Every message committed to "ex-orders2" from now on is copied to
	// "ex-orders2.reminders" 100 ms later: a delay child.
	c.CreateTopic(ctx, "ex-orders2", narad.TopicConfig{Partitions: 1})
	defer c.DeleteTopic(ctx, "ex-orders2")
	child, err := c.CreateChild(ctx, "ex-orders2", "ex-orders2.reminders", 100*time.Millisecond, narad.TopicConfig{Partitions: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteTopic(ctx, child.Name)
	c.Produce(ctx, "ex-orders2", "order 1 placed")

	msgs, _ := c.Receive(ctx, child.Name, narad.WithWait(5*time.Second))
	for _, m := range msgs {
		fmt.Println("reminder:", string(m.Bytes()))
		m.Ack(ctx)
	}
	// Output: reminder: order 1 placed
}

func ExampleClient_CreateUser() {
	ctx := context.Background()
	admin, _ := narad.New([]string{endpoint()}, narad.WithBasicAuth("admin", os.Getenv("NARAD_ADMIN_PASSWORD")))
	defer admin.Close()

	_, err := admin.CreateUser(ctx, "billing", "a long secret", []narad.Grant{
		{Action: "produce", Topics: []string{"invoices.*"}},
		{Action: "consume", Topics: []string{"payments"}},
	})
	if errors.Is(err, narad.ErrForbidden) {
		fmt.Println("only admins create users")
	}
}

func ExampleClient_AttachChild() {
	ctx := context.Background()
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()

	c.CreateTopic(ctx, "ex-events", narad.TopicConfig{Partitions: 1})
	defer c.DeleteTopic(ctx, "ex-events")
	c.CreateTopic(ctx, "ex-events.audit", narad.TopicConfig{Partitions: 1})
	defer c.DeleteTopic(ctx, "ex-events.audit")

	// From now on every message of ex-events is copied to ex-events.audit.
	if _, err := c.AttachChild(ctx, "ex-events", "ex-events.audit", 0); err != nil {
		log.Fatal(err)
	}
	c.Produce(ctx, "ex-events", "signed up")
	msgs, _ := c.Receive(ctx, "ex-events.audit", narad.WithWait(5*time.Second))
	for _, m := range msgs {
		fmt.Println("audit:", string(m.Bytes()))
		m.Ack(ctx)
	}
	children, _ := c.Children(ctx, "ex-events")
	for _, ch := range children {
		fmt.Println("child:", ch.Name, "partitions:", len(ch.Lag))
	}
	if err := c.DetachChild(ctx, "ex-events", "ex-events.audit"); err != nil {
		log.Fatal(err)
	}
	// Output:
	// audit: signed up
	// child: ex-events.audit partitions: 1
}

func ExampleClient_AlterTopic() {
	ctx := context.Background()
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()

	c.CreateTopic(ctx, "ex-settings", narad.TopicConfig{Partitions: 2, VisibilityTimeout: 30 * time.Second})
	defer c.DeleteTopic(ctx, "ex-settings")

	// Longer leases for leases taken from now on.
	minute := time.Minute
	t, err := c.AlterTopic(ctx, "ex-settings", narad.TopicUpdate{VisibilityTimeout: &minute})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.Name, t.Partitions, t.VisibilityTimeout)
	// Output: ex-settings 2 1m0s
}

func ExampleWithDeleteIncarnation() {
	ctx := context.Background()
	c, _ := narad.New([]string{endpoint()})
	defer c.Close()

	c.CreateTopic(ctx, "ex-delete", narad.TopicConfig{Partitions: 1})
	seen, err := c.Topic(ctx, "ex-delete") // what a page or a script showed
	if err != nil {
		log.Fatal(err)
	}
	// Meanwhile someone deletes the topic and creates it again.
	c.DeleteTopic(ctx, "ex-delete")
	c.CreateTopic(ctx, "ex-delete", narad.TopicConfig{Partitions: 1})

	// Deleting the topic that was seen leaves the new one alone.
	err = c.DeleteTopic(ctx, "ex-delete", narad.WithDeleteIncarnation(seen.Incarnation))
	var e *narad.Error
	if errors.As(err, &e) && e.Code == narad.CodeIncarnationMismatch {
		fmt.Println("not deleted:", errors.Is(err, narad.ErrConflict))
	}
	now, _ := c.Topic(ctx, "ex-delete")
	err = c.DeleteTopic(ctx, "ex-delete", narad.WithDeleteIncarnation(now.Incarnation))
	fmt.Println("deleted:", err == nil)
	// Output:
	// not deleted: true
	// deleted: true
}
