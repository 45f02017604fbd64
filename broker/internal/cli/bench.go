package cli

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

func benchCommand() *command {
	return &command{name: "bench", usage: "TOPIC [flags]", args: 1,
		summary: "measure produce and consume throughput and p50/p95/p99 latency",
		help: `Producers and consumers run at once on TOPIC (created with --partitions unless it
exists; use a topic of its own: the consumers ack what they take). Produce latency is
one produce call; end-to-end latency is from just before a produce to its receipt.`,
		setup: func(fs *flag.FlagSet) runFunc {
			var o benchOpts
			fs.IntVar(&o.messages, "messages", 10000, "messages to produce")
			fs.IntVar(&o.size, "size", 256, "bytes per message (at least 16)")
			fs.IntVar(&o.producers, "producers", 8, "concurrent producers")
			fs.IntVar(&o.consumers, "consumers", 4, "concurrent consumers")
			fs.IntVar(&o.batch, "batch", 100, "messages per consume poll and ack batch")
			fs.IntVar(&o.partitions, "partitions", 3, "partitions when the topic is created")
			return func(ctx context.Context, e *env, args []string) error {
				return o.run(ctx, e, args[0])
			}
		}}
}

type benchOpts struct {
	messages, size, producers, consumers, batch, partitions int
}

// benchResult is the --output json shape of bench.
type benchResult struct {
	Messages int        `json:"messages"`
	Bytes    int        `json:"bytes"`
	Produce  benchPhase `json:"produce"`
	Consume  benchPhase `json:"consume"`
}

type benchPhase struct {
	Count        int     `json:"count"`
	Seconds      float64 `json:"seconds"`
	MessagesPerS float64 `json:"messages_per_second"`
	Latency      latency `json:"latency_ms"`
	LatencyIsE2E bool    `json:"end_to_end"`
	Errors       int     `json:"errors"`
}

type latency struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func percentiles(ds []time.Duration) latency {
	if len(ds) == 0 {
		return latency{}
	}
	slices.Sort(ds)
	at := func(q float64) float64 {
		i := int(q*float64(len(ds))+0.5) - 1
		i = min(max(i, 0), len(ds)-1)
		return float64(ds[i].Microseconds()) / 1000
	}
	return latency{P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: float64(ds[len(ds)-1].Microseconds()) / 1000}
}

func (o *benchOpts) run(ctx context.Context, e *env, topic string) error {
	f, err := e.format()
	if err != nil {
		return err
	}
	if o.messages < 1 || o.size < 16 || o.producers < 1 || o.consumers < 1 || o.batch < 1 || o.batch > narad.MaxBatchMessages {
		return usagef("--messages, --producers, --consumers and --batch must be at least 1 (--batch at most %d), --size at least 16", narad.MaxBatchMessages)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	if _, err := c.EnsureTopic(ctx, topic, narad.TopicConfig{Partitions: o.partitions}); err != nil {
		return err
	}
	start := time.Now()
	var (
		mu                 sync.Mutex
		prodLat, e2eLat    []time.Duration
		prodErrs, consErrs int
		received           atomic.Int64
		prodDone, consDone time.Duration
		next               atomic.Int64
		wgProd, wgCons     sync.WaitGroup
	)
	cctx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	for range o.consumers {
		wgCons.Add(1)
		go func() {
			defer wgCons.Done()
			for cctx.Err() == nil && received.Load() < int64(o.messages) {
				msgs, err := c.Receive(cctx, topic, narad.WithMaxMessages(o.batch), narad.WithWait(time.Second))
				if err != nil {
					if cctx.Err() == nil {
						mu.Lock()
						consErrs++
						mu.Unlock()
					}
					continue
				}
				now := time.Now()
				var lats []time.Duration
				for _, m := range msgs {
					if b := m.Bytes(); len(b) >= 8 {
						lats = append(lats, now.Sub(start.Add(time.Duration(binary.BigEndian.Uint64(b)))))
					}
				}
				if len(msgs) > 0 {
					if _, err := c.AckBatch(context.WithoutCancel(cctx), topic, msgs); err != nil {
						mu.Lock()
						consErrs++
						mu.Unlock()
					}
				}
				mu.Lock()
				e2eLat = append(e2eLat, lats...)
				mu.Unlock()
				if received.Add(int64(len(msgs))) >= int64(o.messages) {
					mu.Lock()
					if consDone == 0 {
						consDone = time.Since(start)
					}
					mu.Unlock()
					stopConsumers()
				}
			}
		}()
	}
	for range o.producers {
		wgProd.Add(1)
		go func() {
			defer wgProd.Done()
			body := make([]byte, o.size)
			for ctx.Err() == nil && next.Add(1) <= int64(o.messages) {
				sent := time.Now()
				binary.BigEndian.PutUint64(body, uint64(sent.Sub(start)))
				_, err := c.Produce(ctx, topic, body)
				d := time.Since(sent)
				mu.Lock()
				if err != nil {
					prodErrs++
				} else {
					prodLat = append(prodLat, d)
				}
				mu.Unlock()
			}
		}()
	}
	wgProd.Wait()
	prodDone = time.Since(start)
	if prodErrs > 0 && len(prodLat) == 0 {
		stopConsumers()
	}
	// Consumers stop once every produced message is in, or 30 s after the producers
	// finished when some never arrive (a produce that failed, another consumer).
	go func() {
		select {
		case <-time.After(30 * time.Second):
			stopConsumers()
		case <-cctx.Done():
		}
	}()
	wgCons.Wait()
	if consDone == 0 {
		consDone = time.Since(start)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r := benchResult{Messages: o.messages, Bytes: o.size,
		Produce: benchPhase{Count: len(prodLat), Seconds: prodDone.Seconds(), Latency: percentiles(prodLat), Errors: prodErrs},
		Consume: benchPhase{Count: int(received.Load()), Seconds: consDone.Seconds(), Latency: percentiles(e2eLat), LatencyIsE2E: true, Errors: consErrs}}
	r.Produce.MessagesPerS = float64(r.Produce.Count) / r.Produce.Seconds
	r.Consume.MessagesPerS = float64(r.Consume.Count) / r.Consume.Seconds
	if f == "json" {
		if err := writeJSON(e.Stdout, r); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(e.Stdout, "%d messages of %d bytes, %d producers, %d consumers\n", o.messages, o.size, o.producers, o.consumers)
		for _, p := range []struct {
			name string
			ph   benchPhase
		}{{"produce", r.Produce}, {"consume (end to end)", r.Consume}} {
			fmt.Fprintf(e.Stdout, "%-21s %7d msgs in %6.2fs = %9.0f msg/s   p50 %7.2f ms  p95 %7.2f ms  p99 %7.2f ms  max %7.2f ms  errors %d\n",
				p.name, p.ph.Count, p.ph.Seconds, p.ph.MessagesPerS, p.ph.Latency.P50, p.ph.Latency.P95, p.ph.Latency.P99, p.ph.Latency.Max, p.ph.Errors)
		}
	}
	if prodErrs > 0 || r.Consume.Count < r.Produce.Count {
		return fmt.Errorf("%d produces failed, %d of %d produced messages consumed", prodErrs, r.Consume.Count, r.Produce.Count)
	}
	return nil
}
