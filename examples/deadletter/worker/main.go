// Command worker shows dead letters in user code. Every message travels in the SDK's
// envelope (narad.envelope/1), which carries an attempt count. When handling fails, the
// worker produces the message again with attempt+1 and only then acks the one it holds —
// in that order, so a crash between the two leaves a duplicate (the envelope's id tells
// them apart), never a loss. After --max-attempts failures the message is parked in the
// dead-letter topic (<topic>-dlq) with its last error, and the worker moves on. The dlq
// tool beside it inspects the parked messages and re-drives them after a fix.
//
//	go run ./deadletter/worker --produce 20 --exit-when-empty
//	go run ./deadletter/dlq inspect
//	go run ./deadletter/dlq redrive
//	go run ./deadletter/worker --fixed --exit-when-empty
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"

	"github.com/narad-mq/narad/examples/internal/cli"
)

// Payment is the work: charge a card.
type Payment struct {
	ID          int `json:"id"`
	AmountCents int `json:"amount_cents"`
}

type config struct {
	topic, dlq              string
	produce, maxAttempts    int
	poisonEvery, flakyEvery int
	fixed, exitWhenEmpty    bool
	workers                 int
}

func main() {
	var cfg config
	flag.StringVar(&cfg.topic, "topic", "payments", "the work topic")
	flag.StringVar(&cfg.dlq, "dlq", "", "the dead-letter topic (default <topic>-dlq)")
	flag.IntVar(&cfg.produce, "produce", 0, "payments to produce first")
	flag.IntVar(&cfg.maxAttempts, "max-attempts", 3, "attempts before a message is parked")
	flag.IntVar(&cfg.poisonEvery, "poison-every", 5, "every Nth payment always fails (a bug waiting for a fix; 0: none)")
	flag.IntVar(&cfg.flakyEvery, "flaky-every", 3, "every Nth payment fails on its first attempt only (a timeout; 0: none)")
	flag.BoolVar(&cfg.fixed, "fixed", false, "the bug is fixed: poison payments succeed")
	flag.BoolVar(&cfg.exitWhenEmpty, "exit-when-empty", false, "stop once the work topic has nothing unsettled")
	flag.IntVar(&cfg.workers, "workers", 4, "messages handled at once")
	flag.Parse()
	if cfg.dlq == "" {
		cfg.dlq = cfg.topic + "-dlq"
	}
	ctx, stop := cli.SignalContext()
	defer stop()
	if err := run(ctx, cfg); err != nil {
		cli.Fatal(err)
	}
}

// charge is the business logic, with two kinds of failure to show.
func charge(cfg config, p Payment, attempt int) error {
	switch {
	case cfg.poisonEvery > 0 && p.ID%cfg.poisonEvery == 0 && !cfg.fixed:
		return errors.New("processor rejected the request: currency missing")
	case cfg.flakyEvery > 0 && p.ID%cfg.flakyEvery == 0 && attempt == 1:
		return errors.New("processor timed out")
	}
	return nil
}

func run(ctx context.Context, cfg config) error {
	c, err := cli.Connect()
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // Client.Close always returns nil
	for _, t := range []string{cfg.topic, cfg.dlq} {
		if _, err := c.EnsureTopic(ctx, t, narad.TopicConfig{}); err != nil {
			return err
		}
	}

	for i := 1; i <= cfg.produce; i++ {
		// The envelope's id is made once, here: every retry of this produce, and every
		// re-produce below, carries the same id.
		env, err := narad.NewEnvelope(Payment{ID: i, AmountCents: 100 * i})
		if err != nil {
			return err
		}
		env.Origin = cfg.topic
		if _, err := c.Produce(ctx, cfg.topic, env, narad.WithKey(fmt.Sprint("payment-", i))); err != nil {
			return err
		}
	}
	if cfg.produce > 0 {
		fmt.Printf("produced %d payments to %s\n", cfg.produce, cfg.topic)
	}

	var succeeded, retried, parked atomic.Int64
	handler := func(ctx context.Context, m *narad.Message) error {
		env, ok := narad.OpenEnvelope(m)
		if !ok { // a plain message: wrap it as attempt 1
			wrapped, err := narad.NewEnvelope(json.RawMessage(m.Bytes()))
			if err != nil {
				return err
			}
			wrapped.Origin = cfg.topic
			env = wrapped
		}
		var p Payment
		if err := env.Decode(&p); err != nil {
			return err
		}
		failure := charge(cfg, p, env.Attempt)
		if failure == nil {
			succeeded.Add(1)
			fmt.Printf("payment %d charged (attempt %d)\n", p.ID, env.Attempt)
			return nil // acked by the Consumer
		}

		next := env.Clone() // same id, same body
		next.LastError = failure.Error()
		dest := cfg.topic
		if env.Attempt >= cfg.maxAttempts {
			dest = cfg.dlq // parked: attempt stays the number of attempts made
		} else {
			next.Attempt = env.Attempt + 1
		}
		// 1. Produce the next step. If this fails, return the error: the Consumer hands
		//    the message back and it is tried again as it is — nothing moved yet.
		if _, err := c.Produce(ctx, dest, next, narad.WithKey(m.Key)); err != nil {
			return fmt.Errorf("re-produce to %s: %w", dest, err)
		}
		// 2. Only now ack the original (the Consumer does on nil). A crash between 1 and 2
		//    means the original comes back after its lease and is produced once more: a
		//    duplicate with the same envelope id, never a loss.
		if dest == cfg.dlq {
			parked.Add(1)
			fmt.Printf("payment %d parked in %s after %d attempts: %v\n", p.ID, cfg.dlq, env.Attempt, failure)
		} else {
			retried.Add(1)
			fmt.Printf("payment %d failed on attempt %d (%v): re-produced as attempt %d\n", p.ID, env.Attempt, failure, next.Attempt)
		}
		return nil
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.exitWhenEmpty {
		cli.WhenEmpty(runCtx, c, cfg.topic, 300*time.Millisecond, cancel)
	}
	err = c.Consume(runCtx, cfg.topic, handler, narad.WithConcurrency(cfg.workers),
		narad.WithErrorHandler(func(err error) { fmt.Fprintln(os.Stderr, "consumer:", err) }))
	fmt.Printf("succeeded %d, retried %d, parked %d\n", succeeded.Load(), retried.Load(), parked.Load())
	return err
}
