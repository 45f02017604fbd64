// Command dlq looks after a dead-letter topic filled by the worker beside it (or by any
// code that parks narad.envelope/1 messages).
//
//	dlq inspect [--topic payments-dlq]   list every parked message by replaying the log
//	dlq redrive [--topic payments-dlq]   send parked messages back where they came from
//
// inspect takes no leases: it reads the topic's log from offset 0 and shows each
// message's id, attempts, origin and last error, and which ones are still waiting
// (those past the ack frontier) — run it as often as you like, it changes nothing.
// redrive takes each waiting message under a lease, produces it to its origin topic with
// a fresh attempt count (the same id), and acks it only after that produce succeeded: a
// crash in between re-drives it twice, never zero times.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"

	"github.com/narad-mq/narad/examples/internal/cli"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "inspect" && os.Args[1] != "redrive") {
		fmt.Fprintln(os.Stderr, "usage: dlq inspect|redrive [--topic payments-dlq] (see --help of each)")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	topic := fs.String("topic", "payments-dlq", "the dead-letter topic")
	to := fs.String("to", "", "redrive: the topic to send messages to (default: each envelope's origin)")
	limit := fs.Int("limit", 0, "redrive: re-drive at most this many (0: all)")
	_ = fs.Parse(os.Args[2:]) // ExitOnError: a bad flag exits with usage

	ctx, stop := cli.SignalContext()
	defer stop()
	c, err := cli.Connect()
	if err != nil {
		cli.Fatal(err)
	}
	defer func() { _ = c.Close() }() // Client.Close always returns nil
	if os.Args[1] == "inspect" {
		err = inspect(ctx, c, *topic)
	} else {
		err = redrive(ctx, c, *topic, *to, *limit)
	}
	if err != nil {
		cli.Fatal(err)
	}
}

func inspect(ctx context.Context, c *narad.Client, topic string) error {
	info, err := c.Topic(ctx, topic)
	if err != nil {
		return err
	}
	frontier := map[int32]int64{}
	var waiting int64
	for _, s := range info.Stats {
		frontier[s.Partition] = s.AckFrontier
		waiting += s.Backlog
	}
	total := 0
	byError := map[string]int{}
	for m, err := range c.Replay(ctx, topic, narad.FromStart()) {
		if err != nil {
			if narad.Retryable(err) {
				continue // the iterator retries on its own; it reports each failure
			}
			return err
		}
		total++
		// Below the ack frontier a message is certainly settled (re-driven). Past it, it
		// is waiting, or acked out of order; the backlog below counts the waiting ones.
		state := "waiting"
		if m.Offset < frontier[m.Partition] {
			state = "re-driven"
		}
		env, ok := narad.OpenEnvelope(m)
		if !ok {
			fmt.Printf("%d@%d  %-9s  (not an envelope) %q\n", m.Partition, m.Offset, state, m.Bytes())
			continue
		}
		byError[env.LastError]++
		fmt.Printf("%d@%d  %-9s  id=%s attempts=%d origin=%s parked=%s\n        error: %s\n        body:  %s\n",
			m.Partition, m.Offset, state, env.ID, env.Attempt, env.Origin,
			m.Timestamp.Format(time.RFC3339), env.LastError, env.Bytes())
	}
	fmt.Printf("%s: %d parked messages in the log, %d waiting to be re-driven\n", topic, total, waiting)
	errs := make([]string, 0, len(byError))
	for e := range byError {
		errs = append(errs, e)
	}
	sort.Slice(errs, func(i, j int) bool { return byError[errs[i]] > byError[errs[j]] })
	for _, e := range errs {
		fmt.Printf("  %4d × %s\n", byError[e], e)
	}
	return nil
}

func redrive(ctx context.Context, c *narad.Client, topic, to string, limit int) error {
	done := 0
	for limit == 0 || done < limit {
		want := 100
		if limit > 0 {
			want = min(want, limit-done)
		}
		msgs, err := c.Receive(ctx, topic, narad.WithMaxMessages(want), narad.WithWait(time.Second))
		if err != nil {
			if narad.Retryable(err) && ctx.Err() == nil {
				continue
			}
			return err
		}
		if len(msgs) == 0 {
			n, err := cli.Backlog(ctx, c, topic)
			if err != nil {
				return err
			}
			if n > 0 {
				fmt.Printf("%d messages are leased by someone else; run redrive again later\n", n)
			}
			break
		}
		for _, m := range msgs {
			if err := redriveOne(ctx, c, m, to); err != nil {
				// Hand it back now so a later run can try again; everything re-driven so
				// far stays re-driven.
				_ = m.Nack(ctx, 0) // if this fails too, the lease expires and the message comes back anyway
				return fmt.Errorf("%d@%d: %w", m.Partition, m.Offset, err)
			}
			done++
		}
	}
	fmt.Printf("re-drove %d messages from %s\n", done, topic)
	return nil
}

func redriveOne(ctx context.Context, c *narad.Client, m *narad.Message, to string) error {
	env, ok := narad.OpenEnvelope(m)
	if !ok {
		return errors.New("not an envelope: no origin to send it back to (use --to)")
	}
	dest := to
	if dest == "" {
		dest = env.Origin
	}
	if dest == "" {
		return errors.New("the envelope names no origin (use --to)")
	}
	next := env.Clone() // the same id: consumers that deduplicate see the same message
	next.Attempt = 1    // a full set of attempts after the fix
	next.SetHeader("redriven-from", fmt.Sprintf("%s/%d@%d", m.Topic, m.Partition, m.Offset))
	next.SetHeader("redriven-error", strings.TrimSpace(env.LastError))
	next.LastError = ""
	if _, err := c.Produce(ctx, dest, next, narad.WithKey(m.Key)); err != nil {
		return err
	}
	if err := m.Ack(ctx); err != nil {
		return err // a 410: the lease lapsed, it comes back and is re-driven again
	}
	fmt.Printf("%d@%d id=%s → %s\n", m.Partition, m.Offset, env.ID, dest)
	return nil
}
