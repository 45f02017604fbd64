// Command ingest pushes a file into a topic, one message per line, as fast as the broker
// takes them. It uses the SDK's Publisher, which batches lines into produce-batch
// requests (by count, bytes and a 5 ms linger), keeps a few batches in flight, and blocks
// Publish while its bounded buffer is full: that is the backpressure — the file is read
// exactly as fast as the broker makes lines durable. Every line gets its own result;
// failures are counted, never hidden.
//
//	go run ./ingest --file events.log
//	go run ./ingest                    # makes a file of --lines lines (1,000,000) first
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	narad "github.com/narad-mq/narad/sdk-go"

	"github.com/narad-mq/narad/examples/internal/cli"
)

type config struct {
	topic, file     string
	lines           int
	batch, inFlight int
	linger          time.Duration
	partitions      int
	progressEvery   time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.topic, "topic", "ingest", "the topic to fill (created when missing)")
	flag.StringVar(&cfg.file, "file", "", "the file to push, one message per line (default: generate one)")
	flag.IntVar(&cfg.lines, "lines", 1_000_000, "lines of the generated file, without --file")
	flag.IntVar(&cfg.batch, "batch", 1000, "most lines per produce-batch request (the broker takes up to 1000)")
	flag.IntVar(&cfg.inFlight, "in-flight", 4, "batch requests in flight at once")
	flag.DurationVar(&cfg.linger, "linger", 5*time.Millisecond, "how long a part-filled batch waits for more lines")
	flag.IntVar(&cfg.partitions, "partitions", 6, "partitions of the topic when this creates it (more partitions, more parallel writes)")
	flag.DurationVar(&cfg.progressEvery, "progress-every", 200*time.Millisecond, "how often the progress bar is redrawn")
	flag.Parse()
	ctx, stop := cli.SignalContext()
	defer stop()
	if err := run(ctx, cfg); err != nil {
		cli.Fatal(err)
	}
}

// generate writes n sensor readings, one per line, to a temporary file.
func generate(n int) (string, error) {
	f, err := os.CreateTemp("", "narad-ingest-*.log")
	if err != nil {
		return "", err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	for i := 0; i < n; i++ {
		fmt.Fprintf(w, "%d sensor-%03d temperature=%d.%d unit=C\n", i, i%250, 15+i%20, i%10)
	}
	if err := w.Flush(); err != nil {
		_ = f.Close() // the flush error is the one to report
		return "", err
	}
	return f.Name(), f.Close()
}

// countingReader counts the bytes read through it, for the progress bar.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// bar draws a progress bar of width cells for done out of total.
func bar(done, total int64, width int) string {
	if total <= 0 {
		return strings.Repeat("?", width)
	}
	full := int(min(done, total) * int64(width) / total)
	return strings.Repeat("█", full) + strings.Repeat("░", width-full)
}

func nextOffsets(ctx context.Context, c *narad.Client, topic string) (int64, error) {
	t, err := c.Topic(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, s := range t.Stats {
		n += s.NextOffset
	}
	return n, nil
}

func run(ctx context.Context, cfg config) error {
	if cfg.file == "" {
		fmt.Printf("generating %d lines… ", cfg.lines)
		path, err := generate(cfg.lines)
		if err != nil {
			return err
		}
		defer func() { _ = os.Remove(path) }() // a temp file; the OS cleans it if this fails
		cfg.file = path
		fmt.Println(path)
	}
	f, err := os.Open(cfg.file)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }() // opened read-only
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()

	c, err := cli.Connect()
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // Client.Close always returns nil
	if _, err := c.EnsureTopic(ctx, cfg.topic, narad.TopicConfig{Partitions: cfg.partitions}); err != nil {
		return err
	}
	before, err := nextOffsets(ctx, c, cfg.topic)
	if err != nil {
		return err
	}

	pub := c.Publisher(cfg.topic, narad.WithBatchCount(cfg.batch), narad.WithInFlightBatches(cfg.inFlight), narad.WithLinger(cfg.linger))

	// Results arrive in any order; one goroutine waits for them in publish order and
	// counts. The channel bounds how many unchecked results we keep.
	var published, ok, failed atomic.Int64
	var firstErr error
	results := make(chan *narad.Pending, 50_000)
	var checked sync.WaitGroup
	checked.Add(1)
	go func() {
		defer checked.Done()
		for r := range results {
			<-r.Done()
			if _, err := r.Result(); err != nil {
				if failed.Add(1) == 1 {
					firstErr = err
				}
				continue
			}
			ok.Add(1)
		}
	}()

	// The progress bar: redrawn in place on a terminal, a line per 10 % otherwise.
	tty := false
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		tty = true
	}
	in := &countingReader{r: f}
	start := time.Now()
	stopBar := make(chan struct{})
	barDone := make(chan struct{})
	go func() {
		defer close(barDone)
		t := time.NewTicker(cfg.progressEvery)
		defer t.Stop()
		lastDecile := int64(-1)
		for final := false; !final; {
			select {
			case <-stopBar:
				final = true
			case <-t.C:
			}
			read, done := in.n.Load(), ok.Load()
			rate := float64(done) / time.Since(start).Seconds()
			line := fmt.Sprintf("%s %3d%%  %d lines durable  %.0f lines/s", bar(read, size, 30), read*100/max(size, 1), done, rate)
			if tty {
				fmt.Fprintf(os.Stderr, "\r%s ", line)
				if final {
					fmt.Fprintln(os.Stderr)
				}
			} else if d := read * 10 / max(size, 1); d != lastDecile || final {
				lastDecile = d
				fmt.Fprintln(os.Stderr, line)
			}
		}
	}()

	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), narad.MaxMessageBytes)
	var readErr error
	for sc.Scan() {
		line := sc.Bytes()
		var body any = string(line) // text, stored as its exact bytes
		if !utf8.Valid(line) {
			body = append([]byte(nil), line...) // other bytes: stored as they are too
		}
		// Publish blocks while the Publisher's buffer is full: backpressure.
		r, err := pub.Publish(ctx, body)
		if err != nil {
			readErr = err
			break
		}
		published.Add(1)
		results <- r
	}
	if readErr == nil {
		readErr = sc.Err()
	}
	// Close sends what is buffered and waits for every result (within the context).
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	_ = pub.Close(closeCtx) // each message's outcome is checked from its result (results) below
	close(results)
	checked.Wait()
	close(stopBar)
	<-barDone
	elapsed := time.Since(start)

	rate := float64(ok.Load()) / elapsed.Seconds()
	mb := float64(in.n.Load()) / (1 << 20)
	fmt.Printf("published %d lines (%.1f MiB) in %s: %.0f lines/s, %.1f MiB/s; %d failed\n",
		ok.Load(), mb, elapsed.Round(time.Millisecond), rate, mb/elapsed.Seconds(), failed.Load())

	after, err := nextOffsets(ctx, c, cfg.topic)
	if err == nil {
		// At least the durable lines; more only if a produce retried after a lost reply
		// stored a batch twice (allowed by default: consumers are idempotent).
		fmt.Printf("%s grew by %d messages\n", cfg.topic, after-before)
		if after-before < ok.Load() {
			return fmt.Errorf("the topic grew by %d messages, fewer than the %d confirmed", after-before, ok.Load())
		}
	}
	switch {
	case readErr != nil:
		return readErr
	case failed.Load() > 0:
		return fmt.Errorf("%d lines failed, the first with: %w", failed.Load(), firstErr)
	case ok.Load() != published.Load():
		return errors.New("some lines have no result")
	}
	return nil
}
