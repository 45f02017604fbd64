// Package cli holds the few lines every Go example shares: where the node is, a client
// for it, and a context that ends on Ctrl-C or SIGTERM.
package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// DefaultURL is the node a plain `narad serve` listens on.
const DefaultURL = "http://127.0.0.1:7942"

// Endpoints returns the nodes named by NARAD_URL (comma-separated for several), or
// DefaultURL when it is unset.
func Endpoints() []string {
	v := strings.TrimSpace(os.Getenv("NARAD_URL"))
	if v == "" {
		return []string{DefaultURL}
	}
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// Connect returns a client for Endpoints, with HTTP Basic credentials from NARAD_USER and
// NARAD_PASSWORD when the node runs with security on.
func Connect() (*narad.Client, error) {
	var opts []narad.Option
	if u := os.Getenv("NARAD_USER"); u != "" {
		opts = append(opts, narad.WithBasicAuth(u, os.Getenv("NARAD_PASSWORD")))
	}
	return narad.New(Endpoints(), opts...)
}

// SignalContext returns a context cancelled by the first Ctrl-C or SIGTERM; a second
// signal kills the process the usual way.
func SignalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		cancel() // restores the default handlers: a second signal ends the process
	}()
	return ctx, cancel
}

// Fatal prints err as the program's last word and exits 1.
func Fatal(err error) {
	fmt.Fprintln(os.Stderr, "error:", err)
	os.Exit(1)
}

// Backlog returns how many messages of topic are not settled yet, over all its
// partitions: waiting, leased or handed back (the broker's per-partition backlog).
func Backlog(ctx context.Context, c *narad.Client, topic string) (int64, error) {
	t, err := c.Topic(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, s := range t.Stats {
		n += s.Backlog
	}
	return n, nil
}

// WhenEmpty calls stop once topic has no unsettled message left (its backlog is 0),
// checking every interval until ctx ends. It returns at once; the checks run in the
// background.
func WhenEmpty(ctx context.Context, c *narad.Client, topic string, interval time.Duration, stop func()) {
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval):
			}
			if n, err := Backlog(ctx, c, topic); err == nil && n == 0 {
				stop()
				return
			}
		}
	}()
}

// EnsureChild creates child as a child of parent whose copies arrive delay after the
// parent committed them (0: at once), or checks that the existing topic child is exactly
// that. A delay child keeps its delay for life, so a mismatch is an error to act on.
func EnsureChild(ctx context.Context, c *narad.Client, parent, child string, delay time.Duration, cfg narad.TopicConfig) error {
	_, err := c.CreateChild(ctx, parent, child, delay, cfg)
	if !errors.Is(err, narad.ErrConflict) {
		return err
	}
	info, err := c.Topic(ctx, child)
	if err != nil {
		return err
	}
	if info.Parent != parent || info.FanoutDelay != delay {
		return fmt.Errorf("%s exists as a child of %q with delay %s, not of %s with %s: delete it or pick another topic name",
			child, info.Parent, info.FanoutDelay, parent, delay)
	}
	return nil
}
