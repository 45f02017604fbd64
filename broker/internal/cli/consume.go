package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

func consumeCommand() *command {
	return &command{name: "consume", usage: "TOPIC [flags]", args: 1,
		summary: "take messages: long polls, prints and acks them (--peek: watch without taking)",
		help: `A consumer leases each message, prints it, then acks it (an acked message is not
delivered again). Without --follow it stops at the first poll that finds nothing.
--no-ack prints without acking: the leases lapse after the topic's visibility timeout
and the messages are delivered again then.
--peek is a bystander instead: it tails every partition from its current end by
replay, leases nothing and changes nothing; it runs until --max or Ctrl-C.`,
		setup: func(fs *flag.FlagSet) runFunc {
			var o consumeOpts
			fs.BoolVar(&o.noAck, "no-ack", false, "do not ack: the messages come back after the visibility timeout")
			fs.IntVar(&o.max, "max", 0, "stop after this many messages (0: no limit)")
			fs.BoolVar(&o.follow, "follow", false, "keep polling for new messages until Ctrl-C")
			fs.BoolVar(&o.peek, "peek", false, "watch new messages on every partition without leasing them")
			fs.DurationVar(&o.wait, "wait", 2*time.Second, "how long one poll waits for a message (up to 20s; --follow polls again and again)")
			fs.IntVar(&o.batch, "batch", 10, "messages per poll (1 to 1000)")
			return func(ctx context.Context, e *env, args []string) error {
				if o.peek {
					if o.noAck {
						return usagef("--peek leases nothing, so --no-ack does not apply")
					}
					return peek(ctx, e, args[0], o.max)
				}
				return o.run(ctx, e, args[0])
			}
		}}
}

type consumeOpts struct {
	noAck, follow, peek bool
	max, batch          int
	wait                time.Duration
}

func (o *consumeOpts) run(ctx context.Context, e *env, topic string) error {
	f, err := e.format()
	if err != nil {
		return err
	}
	if o.batch < 1 || o.batch > narad.MaxBatchMessages {
		return usagef("--batch must be 1 to %d", narad.MaxBatchMessages)
	}
	if o.wait <= 0 || o.wait > 20*time.Second {
		return usagef("--wait must be more than 0 and at most 20s")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	w := &messageWriter{e: e, format: f}
	seen := 0
	for o.max == 0 || seen < o.max {
		n := o.batch
		if o.max > 0 {
			n = min(n, o.max-seen)
		}
		msgs, err := c.Receive(ctx, topic, narad.WithMaxMessages(n), narad.WithWait(o.wait))
		if err != nil {
			if o.follow && ctx.Err() != nil {
				return nil // the way a follow ends: every message printed was acked
			}
			if o.follow && narad.Retryable(err) && ctx.Err() == nil {
				fmt.Fprintf(e.Stderr, "narad consume: %v (polling again)\n", err)
				continue
			}
			return err
		}
		if len(msgs) == 0 {
			if !o.follow {
				return nil
			}
			continue
		}
		var done []*narad.Message
		var werr error
		for i, m := range msgs {
			if ctx.Err() != nil {
				// A signal came while the poll's answer was on its way (the SDK reads
				// it rather than leave its messages leased to nobody): what is not
				// printed is handed back at once, and the next poll, never sent, ends
				// the loop as a signal does.
				for _, back := range msgs[i:] {
					_ = back.Nack(context.WithoutCancel(ctx), 0)
				}
				break
			}
			if werr = w.write(m); werr != nil {
				// Not shown, so not acked: hand it and the rest back at once.
				for _, back := range msgs[i:] {
					_ = back.Nack(context.WithoutCancel(ctx), 0)
				}
				if werr != errBinaryToTerminal {
					werr = fmt.Errorf("writing the output (a closed pipe?): the %d messages not written were handed back: %w", len(msgs)-i, werr)
				}
				break
			}
			done = append(done, m)
			seen++
		}
		if !o.noAck && len(done) > 0 {
			res, err := c.AckBatch(context.WithoutCancel(ctx), topic, done)
			for _, r := range res {
				if r.Err != nil {
					return fmt.Errorf("acking offset %d of partition %d (it will be delivered again): %w", r.Message.Offset, r.Message.Partition, r.Err)
				}
			}
			if err != nil {
				return fmt.Errorf("acking: %w", err)
			}
		}
		if werr != nil {
			return werr
		}
	}
	return nil
}

// peek tails every partition from its end at the start, by replay: it takes no lease,
// so consumers of the topic see no difference. It says on stderr when it is watching,
// so that a script (or a test) knows that what it produces from then on will be shown.
func peek(ctx context.Context, e *env, topic string, max int) error {
	f, err := e.format()
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	info, err := c.Topic(ctx, topic)
	if err != nil {
		return err
	}
	from := map[int32]int64{}
	for _, s := range info.Stats {
		from[s.Partition] = s.NextOffset
	}
	fmt.Fprintf(e.Stderr, "narad consume: peeking at %d partitions of %s from their ends (no leases)\n", len(from), topic)
	return replayTo(ctx, e, c, f, topic, narad.FromOffsets(from), nil, -1, max, true)
}

// replayTo prints a replay until its end (or forever with follow), stopping after max
// messages (0: no limit) and, when to >= 0, past offset to of every partition.
func replayTo(ctx context.Context, e *env, c *narad.Client, format, topic string, from narad.Position, parts []int32, to int64, max int, follow bool) error {
	opts := []narad.ReplayOption{narad.WithFollowInterval(200 * time.Millisecond)}
	if follow {
		opts = append(opts, narad.Follow())
	}
	if parts != nil {
		opts = append(opts, narad.OnlyPartitions(parts...))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := &messageWriter{e: e, format: format}
	seen := 0
	for m, err := range c.Replay(ctx, topic, from, opts...) {
		if err != nil {
			if follow && ctx.Err() != nil {
				return nil // the way a follow or a peek ends
			}
			if narad.Retryable(err) && ctx.Err() == nil {
				fmt.Fprintf(e.Stderr, "narad: %v (trying again)\n", err)
				continue
			}
			return err
		}
		if to >= 0 && m.Offset > to {
			if len(parts) == 1 {
				return nil
			}
			continue
		}
		if err := w.write(m); err != nil {
			return err
		}
		seen++
		if max > 0 && seen >= max {
			return nil
		}
	}
	if !follow && ctx.Err() != nil {
		// The replay ends quietly when its context is cancelled: a signal cut it short
		// of the end it was to reach.
		return ctx.Err()
	}
	return nil
}

func replayCommand() *command {
	return &command{name: "replay", usage: "TOPIC [--partition P] [--from N [--to M] | --from-time T] [flags]", args: 1,
		summary: "read a topic's log without leases (nothing is consumed or acked)",
		help: `--from and --to are offsets, both included. --from-time is an RFC 3339 time
(2024-05-01T10:00:00Z) or a duration ago (15m: from 15 minutes ago). Without
--partition every partition is read. It stops at the end each partition had when it
started, or follows new messages with --follow.`,
		setup: func(fs *flag.FlagSet) runFunc {
			part := fs.Int("partition", -1, "the partition to read (default: all)")
			fromOff := fs.Int64("from", -1, "first offset (default: the oldest retained)")
			to := fs.Int64("to", -1, "last offset, included (default: the end)")
			fromTime := fs.String("from-time", "", "start at the first message written at or after this time")
			max := fs.Int("max", 0, "stop after this many messages (0: no limit)")
			follow := fs.Bool("follow", false, "wait for new messages after the end")
			return func(ctx context.Context, e *env, args []string) error {
				f, err := e.format()
				if err != nil {
					return err
				}
				if *fromOff >= 0 && *fromTime != "" {
					return usagef("give --from or --from-time, not both")
				}
				if *to >= 0 && *fromOff >= 0 && *to < *fromOff {
					return usagef("--to %d is before --from %d", *to, *fromOff)
				}
				if *to >= 0 && *follow {
					return usagef("--to ends the replay, --follow never does: give one")
				}
				var parts []int32
				if *part >= 0 {
					parts = []int32{int32(*part)}
				}
				var from narad.Position
				switch {
				case *fromTime != "":
					t, err := parseTime(*fromTime, time.Now())
					if err != nil {
						return err
					}
					from = narad.FromTime(t)
				case *fromOff >= 0:
					if parts == nil {
						return usagef("--from is an offset of one partition: give --partition")
					}
					from = narad.FromOffsets(map[int32]int64{parts[0]: *fromOff})
				}
				c, err := e.client()
				if err != nil {
					return err
				}
				if parts != nil {
					// The SDK's replay skips a partition it does not know; say so instead.
					info, err := c.Topic(ctx, args[0])
					if err != nil {
						return err
					}
					if int(parts[0]) >= info.Partitions {
						return fmt.Errorf("topic %s has %d partitions, no partition %d: %w", args[0], info.Partitions, parts[0], narad.ErrNotFound)
					}
				}
				return replayTo(ctx, e, c, f, args[0], from, parts, *to, *max, *follow)
			}
		}}
}

// parseTime reads --from-time: RFC 3339, or a duration before now.
func parseTime(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(strings.TrimPrefix(s, "-")); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, usagef("--from-time %q: want an RFC 3339 time (2024-05-01T10:00:00Z) or a duration ago (15m)", s)
}
