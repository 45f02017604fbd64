// Command retrytiers shows retries with backoff, built from plain topics and the SDK's
// RetryTiers helper. Each tier is a retry topic with a delay child:
//
//	emails ──fail──▶ emails.retry-1 ══30 s══▶ emails.retry-1.due ──fail──▶ emails.retry-2 ══5 min══▶ …
//	                                                                   … last tier fails ──▶ emails-dlq
//
// A failed message is produced (in the narad.envelope/1 wrapper, attempt+1) to the retry
// topic of the tier its attempt count picks, then the original is acked. The broker
// copies it to the tier's delay child no earlier than the tier's delay after the commit,
// so nothing polls or sleeps while it waits; a consumer on each delay child runs the same
// handler again. After the last tier the message is parked in the dead-letter topic.
//
// The demo sends one email per outcome: email 1 succeeds at once, email 2 on its second
// attempt (after tier 1), …, and the last one never succeeds and is parked. It checks
// that every retry waited at least its tiers' delays, then exits.
//
//	go run ./retrytiers                         # delays 30s,5m,30m: a 35-minute demo
//	go run ./retrytiers --delays 1s,2s,3s       # the same in seconds
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"

	"github.com/narad-mq/narad/examples/internal/cli"
)

// Email is the work: send one email. SucceedsOn says on which attempt the (simulated)
// mail server accepts it; 0 means never.
type Email struct {
	Run        string `json:"run"`
	N          int    `json:"n"`
	SucceedsOn int    `json:"succeeds_on"`
}

func main() {
	topic := flag.String("topic", "emails", "the main topic; tiers are <topic>.retry-N (+ .due), parking is <topic>-dlq")
	delays := flag.String("delays", "30s,5m,30m", "the tiers' delays, comma-separated, shortest first")
	messages := flag.Int("messages", 0, "emails to send (default: one per tier + 2, so every outcome shows)")
	timeout := flag.Duration("timeout", 0, "give up after this long (default: twice the delays' sum + 30s)")
	flag.Parse()

	var tierDelays []time.Duration
	for _, s := range strings.Split(*delays, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d <= 0 {
			cli.Fatal(fmt.Errorf("--delays: %q is not a positive duration", s))
		}
		tierDelays = append(tierDelays, d)
	}
	if *messages <= 0 {
		*messages = len(tierDelays) + 2
	}
	if *timeout <= 0 {
		var sum time.Duration
		for _, d := range tierDelays {
			sum += d
		}
		*timeout = 2*sum + 30*time.Second
	}
	ctx, stop := cli.SignalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if err := run(ctx, *topic, tierDelays, *messages); err != nil {
		cli.Fatal(err)
	}
}

func run(ctx context.Context, topic string, delays []time.Duration, messages int) error {
	c, err := cli.Connect()
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // Client.Close always returns nil

	tiers := narad.RetryTiers{Topic: topic, Parking: topic + "-dlq"}
	for i, d := range delays {
		tiers.Tiers = append(tiers.Tiers, narad.RetryTier{Topic: fmt.Sprintf("%s.retry-%d", topic, i+1), Delay: d})
	}
	// The main and parking topics, and per tier a retry topic (nobody consumes it: it only
	// feeds its delay child) and its delay child <tier>.due.
	if err := tiers.EnsureTopics(ctx, c, narad.TopicConfig{}); err != nil {
		return err
	}
	for _, t := range tiers.Tiers {
		fmt.Printf("tier %s: delay %s via %s\n", t.Topic, t.Delay, t.DueTopic())
	}

	// One run id per run, so emails left over from an earlier run are not counted.
	run := fmt.Sprintf("%x", time.Now().UnixNano())
	start := time.Now()
	sentAt := map[int]time.Time{}
	for n := 1; n <= messages; n++ {
		e := Email{Run: run, N: n, SucceedsOn: n}
		if n > len(delays)+1 {
			e.SucceedsOn = 0 // never: it ends in the parking topic
		}
		env, err := narad.NewEnvelope(e)
		if err != nil {
			return err
		}
		env.Origin = topic
		sentAt[n] = time.Now()
		if _, err := c.Produce(ctx, topic, env); err != nil {
			return err
		}
	}
	fmt.Printf("sent %d emails to %s\n", messages, topic)

	var mu sync.Mutex
	finished := map[int]string{} // email → outcome
	allDone := make(chan struct{})
	var problems []string
	finish := func(n int, outcome string) {
		mu.Lock()
		defer mu.Unlock()
		if _, dup := finished[n]; dup {
			return // a duplicate: already handled (at least once means this can happen)
		}
		finished[n] = outcome
		if len(finished) == messages {
			close(allDone)
		}
	}

	// The handler sees the envelope's body; m.Envelope() has the attempt count. An error
	// sends the email to the next tier, or to parking after the last one.
	send := func(ctx context.Context, m *narad.Message) error {
		var e Email
		if err := m.Decode(&e); err != nil {
			return err
		}
		if e.Run != run {
			return nil // from an earlier run: just ack it
		}
		attempt := m.Envelope().Attempt
		waited := time.Since(sentAt[e.N])
		// Every retry must have waited at least the delays of the tiers it went through.
		var backoff time.Duration
		for _, d := range delays[:attempt-1] {
			backoff += d
		}
		if waited < backoff {
			mu.Lock()
			problems = append(problems, fmt.Sprintf("email %d attempt %d came after %s, before its tiers' %s", e.N, attempt, waited.Round(time.Millisecond), backoff))
			mu.Unlock()
		}
		at := fmt.Sprintf("t+%5.1fs", time.Since(start).Seconds())
		if e.SucceedsOn == attempt {
			fmt.Printf("%s  email %d sent on attempt %d from %s\n", at, e.N, attempt, m.Topic)
			finish(e.N, fmt.Sprintf("sent on attempt %d, %s after it was first tried", attempt, waited.Round(100*time.Millisecond)))
			return nil
		}
		next := tiers.Parking
		if attempt <= len(tiers.Tiers) {
			next = fmt.Sprintf("%s (due in %s)", tiers.Tiers[attempt-1].Topic, tiers.Tiers[attempt-1].Delay)
		}
		fmt.Printf("%s  email %d failed on attempt %d from %s → %s\n", at, e.N, attempt, m.Topic, next)
		if attempt > len(tiers.Tiers) {
			finish(e.N, fmt.Sprintf("parked after %d attempts, %s after it was first tried", attempt, waited.Round(100*time.Millisecond)))
		}
		return errors.New("mail server said 451: try again later")
	}

	// One consumer on the main topic and one on each tier's delay child, all running send.
	consumeCtx, stopConsumers := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() {
		consumed <- tiers.Consume(consumeCtx, c, send, narad.WithConcurrency(4), narad.WithWait(2*time.Second))
	}()
	select {
	case <-allDone:
	case <-ctx.Done():
	case err := <-consumed: // a consumer stopped on a terminal error (the others with it)
		stopConsumers()
		return err
	}
	// Stopping drains: a handler that just failed finishes routing and acking first.
	stopConsumers()
	if err := <-consumed; err != nil {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("only %d of %d emails finished in time", len(finished), messages)
	}

	// The parked email is in the parking topic, with its last error.
	parked := 0
	for m, err := range c.Replay(ctx, tiers.Parking, narad.FromStart()) {
		if err != nil {
			return err
		}
		env, ok := narad.OpenEnvelope(m)
		var e Email
		if ok && env.Decode(&e) == nil && e.Run == run {
			parked++
			fmt.Printf("in %s: email %d, %d attempts, last error %q\n", tiers.Parking, e.N, env.Attempt, env.LastError)
		}
	}
	for n := 1; n <= messages; n++ {
		fmt.Printf("email %d: %s\n", n, finished[n])
	}
	wantParked := max(0, messages-len(delays)-1)
	if parked != wantParked {
		problems = append(problems, fmt.Sprintf("%d emails parked, want %d", parked, wantParked))
	}
	if len(problems) > 0 {
		fmt.Fprintln(os.Stderr, strings.Join(problems, "\n"))
		return errors.New("the retry tiers misbehaved")
	}
	fmt.Printf("all %d emails finished in %s; every retry waited its tiers' delays\n", messages, time.Since(start).Round(100*time.Millisecond))
	return nil
}
