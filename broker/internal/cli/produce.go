package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

func produceCommand() *command {
	return &command{name: "produce", usage: "TOPIC [MSG] [flags]", args: -2,
		summary: "write messages: MSG, --file, or each line of stdin",
		help: `Each message is durable when its line is printed (partition and offset).
Without MSG or --file, every line of stdin is a message (empty lines are skipped).
--count N sends MSG (or the file) N times, or "message 1".."message N" without one.
--batch sends up to --batch-size messages per request.`,
		setup: func(fs *flag.FlagSet) runFunc {
			var o produceOpts
			fs.StringVar(&o.key, "key", "", "message key: the same key always lands in the same partition")
			fs.IntVar(&o.partition, "partition", -1, "write to this partition (overrides the key)")
			fs.StringVar(&o.file, "file", "", "send this file's bytes as one message (- for all of stdin)")
			fs.StringVar(&o.contentType, "content-type", "", "Content-Type of the messages (default text/plain for text, application/octet-stream for --file)")
			fs.IntVar(&o.count, "count", 0, "send this many messages")
			fs.Float64Var(&o.rate, "rate", 0, "at most this many messages per second (0: as fast as possible)")
			fs.BoolVar(&o.batch, "batch", false, "send messages in batch requests")
			fs.IntVar(&o.batchSize, "batch-size", 100, "messages per batch request (1 to 1000)")
			fs.BoolVar(&o.quiet, "quiet", false, "print nothing on success")
			return func(ctx context.Context, e *env, args []string) error {
				if len(args) > 2 {
					return usagef("one MSG at most (quote it); for many, use stdin lines")
				}
				return o.run(ctx, e, args)
			}
		}}
}

type produceOpts struct {
	key, file, contentType string
	partition, count       int
	batchSize              int
	rate                   float64
	batch, quiet           bool
}

type producedJSON struct {
	Partition int32 `json:"partition"`
	Offset    int64 `json:"offset"`
}

func (o *produceOpts) run(ctx context.Context, e *env, args []string) error {
	f, err := e.format()
	if err != nil {
		return err
	}
	topic := args[0]
	if o.batchSize < 1 || o.batchSize > narad.MaxBatchMessages {
		return usagef("--batch-size must be 1 to %d", narad.MaxBatchMessages)
	}
	if o.count < 0 || o.rate < 0 {
		return usagef("--count and --rate cannot be negative")
	}
	// The pace is one message every 1/rate seconds, which must be a duration of at
	// least a nanosecond (time.NewTicker panics otherwise).
	if iv := float64(time.Second) / o.rate; math.IsNaN(o.rate) || o.rate > 0 && (iv < 1 || iv > math.MaxInt64) {
		return usagef("--rate %v: want 0 (no limit), or from 1e-9 to 1e9 messages per second", o.rate)
	}
	if len(args) == 2 && o.file != "" {
		return usagef("give MSG or --file, not both")
	}
	// next yields the bodies one at a time; ok is false at the end.
	var next func() (body any, ok bool, err error)
	var fixed any
	switch {
	case len(args) == 2:
		fixed = args[1]
	case o.file != "":
		var b []byte
		if o.file == "-" {
			b, err = readAll(ctx, e.Stdin)
		} else {
			b, err = os.ReadFile(o.file)
		}
		if err != nil {
			return fmt.Errorf("reading --file: %w", err)
		}
		fixed = b
	}
	switch {
	case fixed != nil:
		n := max(o.count, 1)
		next = func() (any, bool, error) {
			if n == 0 {
				return nil, false, nil
			}
			n--
			return fixed, true, nil
		}
	case o.count > 0:
		i := 0
		next = func() (any, bool, error) {
			if i == o.count {
				return nil, false, nil
			}
			i++
			return "message " + strconv.Itoa(i), true, nil
		}
	default:
		next = stdinLines(ctx, e.Stdin)
	}
	var opts []narad.ProduceOption
	if o.key != "" {
		opts = append(opts, narad.WithKey(o.key))
	}
	if o.partition >= 0 {
		opts = append(opts, narad.WithPartition(int32(o.partition)))
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	report := func(p narad.Produced) {
		if o.quiet {
			return
		}
		switch f {
		case "json":
			line, _ := json.Marshal(producedJSON{p.Partition, p.Offset})
			_, _ = e.Stdout.Write(append(line, '\n')) // like the fmt.Fprintf lines around it
		default:
			fmt.Fprintf(e.Stdout, "%d\t%d\n", p.Partition, p.Offset)
		}
	}
	var pace <-chan time.Time
	if o.rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / o.rate))
		defer t.Stop()
		pace = t.C
	}
	wait := func() error {
		if pace == nil {
			return ctx.Err()
		}
		select {
		case <-pace:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	body := func(b any) any {
		if o.contentType == "" {
			return b
		}
		if s, ok := b.(string); ok {
			return []byte(s)
		}
		return b
	}
	if o.contentType != "" {
		opts = append(opts, narad.WithContentType(o.contentType))
	}
	if !o.batch {
		for {
			b, ok, err := next()
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			if err := wait(); err != nil {
				return err
			}
			p, err := c.Produce(ctx, topic, body(b), opts...)
			if err != nil {
				return err
			}
			report(p)
		}
		return nil
	}
	if o.contentType != "" {
		return usagef("--content-type does not apply to --batch (a batch carries text, JSON strings and bytes)")
	}
	var part *int32
	if o.partition >= 0 {
		part = narad.Pin(int32(o.partition))
	}
	// flush sends a batch and prints where each of its stored messages went. A failed
	// message is named on stderr by its number in the input (from 1; for stdin, the
	// n-th non-empty line); the command stops after a batch with failures, sending
	// nothing more.
	sent, stored := 0, 0
	flush := func(batch []narad.Outgoing) error {
		if len(batch) == 0 {
			return nil
		}
		res, err := c.ProduceBatch(ctx, topic, batch)
		if stored == 0 && len(res) > 0 && res[0].Err != nil && res[0].Err == res[len(res)-1].Err {
			return err // nothing stored yet, and all of the batch failed alike
		}
		failed := false
		for i := 0; i < len(res); i++ {
			if res[i].Err == nil {
				stored++
				report(res[i].Produced)
				continue
			}
			// A run of messages that failed alike (a request's) is named once.
			j := i
			for j+1 < len(res) && res[j+1].Err == res[i].Err {
				j++
			}
			failed = true
			if j == i {
				fmt.Fprintf(e.Stderr, "narad produce: message %d not stored: %v\n", sent+i+1, res[i].Err)
			} else {
				fmt.Fprintf(e.Stderr, "narad produce: messages %d to %d not stored: %v\n", sent+i+1, sent+j+1, res[i].Err)
			}
			i = j
		}
		sent += len(batch)
		if err != nil || failed {
			return &partlyStored{fmt.Sprintf("%d of the first %d messages were stored (printed), the others not (named above); sending stopped there", stored, sent), err}
		}
		return nil
	}
	var batch []narad.Outgoing
	for {
		b, ok, err := next()
		if err != nil {
			if ctx.Err() == nil {
				// The lines read before a bad one are sent, as without --batch.
				if ferr := flush(batch); ferr != nil {
					return ferr
				}
			}
			return err
		}
		if !ok {
			break
		}
		if err := wait(); err != nil {
			return err
		}
		batch = append(batch, narad.Outgoing{Body: b, Key: o.key, Partition: part})
		if len(batch) == o.batchSize {
			if err := flush(batch); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	return flush(batch)
}

// stdinLines returns a next function yielding the non-empty lines of r. The reading
// runs in a goroutine so that a signal stops the command while it waits for a line (an
// interactive stdin, tail -f): next then fails with ctx's error. A read left blocked
// ends with the process.
func stdinLines(ctx context.Context, r io.Reader) func() (any, bool, error) {
	type line struct {
		s   string
		err error
	}
	lines := make(chan line)
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), narad.MaxMessageBytes+1)
		n := 0
		for sc.Scan() {
			n++
			if s := sc.Text(); s != "" {
				select {
				case lines <- line{s: s}:
				case <-ctx.Done():
					return
				}
			}
		}
		err := sc.Err()
		switch {
		case errors.Is(err, bufio.ErrTooLong):
			err = fmt.Errorf("line %d of stdin is longer than %d bytes, the most a message holds: it and the lines after it were not sent (send a large message with --file)", n+1, narad.MaxMessageBytes)
		case err != nil:
			err = fmt.Errorf("reading stdin after line %d: %w", n, err)
		}
		select {
		case lines <- line{err: err}:
		case <-ctx.Done():
		}
		close(lines)
	}()
	return func() (any, bool, error) {
		select {
		case l, ok := <-lines:
			if !ok || l.err != nil || l.s == "" {
				return nil, false, l.err
			}
			return l.s, true, nil
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// readAll reads all of r, or fails with ctx's error when a signal comes first.
func readAll(ctx context.Context, r io.Reader) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(r)
		done <- result{b, err}
	}()
	select {
	case res := <-done:
		return res.b, res.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// partlyStored ends a batch produce that stored part of what it sent: the failures
// were named already, so it says only what was stored; it wraps them for the exit code.
type partlyStored struct {
	msg string
	err error
}

func (p *partlyStored) Error() string { return p.msg }
func (p *partlyStored) Unwrap() error { return p.err }
