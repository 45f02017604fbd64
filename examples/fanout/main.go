// Command fanout shows one topic feeding several services. Every order produced to
// `orders` is copied by the broker into three child topics, each a normal topic with
// its own consumers, leases and acks:
//
//	orders ─┬─▶ orders.analytics   revenue per customer
//	        ├─▶ orders.billing     charge each order once
//	        └─▶ orders.reminders   a delay child: each copy arrives --reminder-delay later
//	                               ("your order ships soon"), with no timer in user code
//
// The producer knows nothing of the consumers: adding a fourth service is one attach.
// The demo produces --orders orders, runs the three consumers until each has seen every
// order, checks what each computed and that no reminder came early, and exits.
//
//	go run ./fanout                             # reminders 30 s after each order
//	go run ./fanout --reminder-delay 2s --orders 50
package main

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"

	"github.com/narad-mq/narad/examples/internal/cli"
)

// Order is what the shop produces.
type Order struct {
	Run        string    `json:"run"`
	ID         int       `json:"id"`
	Customer   string    `json:"customer"`
	TotalCents int64     `json:"total_cents"`
	PlacedAt   time.Time `json:"placed_at"`
}

func main() {
	topic := flag.String("topic", "orders", "the parent topic; children are <topic>.analytics, .billing and .reminders")
	orders := flag.Int("orders", 20, "orders to produce")
	delay := flag.Duration("reminder-delay", 30*time.Second, "how long after each order its reminder arrives")
	timeout := flag.Duration("timeout", 0, "give up after this long (default: the reminder delay + 30s)")
	flag.Parse()
	if *timeout <= 0 {
		*timeout = *delay + 30*time.Second
	}
	ctx, stop := cli.SignalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if err := run(ctx, *topic, *orders, *delay); err != nil {
		cli.Fatal(err)
	}
}

// tally counts one consumer's view of this run's orders.
type tally struct {
	mu      sync.Mutex
	seen    map[int]bool
	want    int
	done    chan struct{}
	revenue map[string]int64
	early   []string
}

func newTally(want int) *tally {
	return &tally{seen: map[int]bool{}, want: want, done: make(chan struct{}), revenue: map[string]int64{}}
}

// first records order id and says whether this is its first delivery: fan-out copies
// and deliveries are at least once, so every consumer must shrug off a repeat.
func (t *tally) first(id int, f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.seen[id] {
		return
	}
	t.seen[id] = true
	f()
	if len(t.seen) == t.want {
		close(t.done)
	}
}

func run(ctx context.Context, topic string, n int, delay time.Duration) error {
	c, err := cli.Connect()
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // Client.Close always returns nil

	analytics, billing, reminders := topic+".analytics", topic+".billing", topic+".reminders"
	if _, err := c.EnsureTopic(ctx, topic, narad.TopicConfig{Retention: delay + 24*time.Hour}); err != nil {
		return err
	}
	for _, ch := range []struct {
		name  string
		delay time.Duration
	}{{analytics, 0}, {billing, 0}, {reminders, delay}} {
		if err := cli.EnsureChild(ctx, c, topic, ch.name, ch.delay, narad.TopicConfig{}); err != nil {
			return err
		}
	}
	children, err := c.Children(ctx, topic)
	if err != nil {
		return err
	}
	for _, ch := range children {
		fmt.Printf("child %s (delay %s)\n", ch.Name, ch.FanoutDelay)
	}

	// Produce the orders, keyed by customer: a customer's orders share a partition in the
	// parent and, with equal partition counts, in every child too.
	run := fmt.Sprintf("%x", time.Now().UnixNano())
	batch := make([]narad.Outgoing, n)
	want := map[string]int64{}
	for i := range batch {
		o := Order{Run: run, ID: i + 1, Customer: fmt.Sprintf("customer-%d", i%5+1), TotalCents: int64(1000 + 137*i), PlacedAt: time.Now()}
		want[o.Customer] += o.TotalCents
		batch[i] = narad.Outgoing{Body: o, Key: o.Customer}
	}
	if _, err := c.ProduceBatch(ctx, topic, batch); err != nil {
		return err
	}
	fmt.Printf("produced %d orders to %s\n", n, topic)

	an, bi, re := newTally(n), newTally(n), newTally(n)
	var charged int64
	consumers := map[string]narad.Handler{
		analytics: func(ctx context.Context, m *narad.Message) error {
			var o Order
			if err := m.Decode(&o); err != nil || o.Run != run {
				return err // nil for an order of an earlier run: acked and skipped
			}
			an.first(o.ID, func() { an.revenue[o.Customer] += o.TotalCents })
			return nil
		},
		billing: func(ctx context.Context, m *narad.Message) error {
			var o Order
			if err := m.Decode(&o); err != nil || o.Run != run {
				return err
			}
			bi.first(o.ID, func() { charged += o.TotalCents })
			return nil
		},
		reminders: func(ctx context.Context, m *narad.Message) error {
			var o Order
			if err := m.Decode(&o); err != nil || o.Run != run {
				return err
			}
			late := time.Since(o.PlacedAt)
			re.first(o.ID, func() {
				fmt.Printf("reminder for order %d (%s) arrived %s after the order\n", o.ID, o.Customer, late.Round(10*time.Millisecond))
				if late < delay {
					re.early = append(re.early, fmt.Sprintf("order %d: reminder after %s < %s", o.ID, late, delay))
				}
			})
			return nil
		},
	}
	cctx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	var wg sync.WaitGroup
	errs := make(chan error, len(consumers))
	for t, h := range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Consume(cctx, t, h, narad.WithConcurrency(4), narad.WithWait(2*time.Second)); err != nil {
				errs <- fmt.Errorf("%s: %w", t, err)
			}
		}()
	}

	for _, t := range []*tally{an, bi} {
		select {
		case <-t.done:
		case <-ctx.Done():
		}
	}
	if ctx.Err() == nil {
		fmt.Printf("analytics and billing saw all %d orders; waiting for the reminders (%s)\n", n, delay)
		if children, err := c.Children(ctx, topic); err == nil {
			for _, ch := range children {
				var lag int64
				for _, l := range ch.Lag {
					lag += l.Lag
				}
				fmt.Printf("  %s: %d copies still to make\n", ch.Name, lag)
			}
		}
	}
	select {
	case <-re.done:
	case <-ctx.Done():
	}
	stopConsumers()
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("timed out: analytics %d, billing %d, reminders %d of %d orders", len(an.seen), len(bi.seen), len(re.seen), n)
	}

	var total int64
	for cust, cents := range want {
		total += cents
		if an.revenue[cust] != cents {
			return fmt.Errorf("analytics counted %d cents for %s, want %d", an.revenue[cust], cust, cents)
		}
	}
	if charged != total {
		return fmt.Errorf("billing charged %d cents, want %d", charged, total)
	}
	if len(re.early) > 0 {
		return fmt.Errorf("reminders came early: %v", re.early)
	}
	fmt.Printf("analytics: revenue of %d customers adds up to %d cents\n", len(an.revenue), total)
	fmt.Printf("billing: charged %d orders, %d cents\n", len(bi.seen), charged)
	fmt.Printf("reminders: %d sent, none earlier than %s after its order\n", len(re.seen), delay)
	return nil
}
