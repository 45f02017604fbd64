// Command narad-remote-bench measures remote children (issue 26): it starts two narad
// nodes on free loopback ports (a source and a remote cluster of one node each), then
//
//  1. measures the source's produce-only rate (batched produce, no child attached);
//  2. for a falling series of fractions of that rate, produces at that fixed rate into
//     a topic copied to the remote by a remote child, samples the copy's lag in seconds
//     (the age of the oldest message not yet copied, from GET /children) four times a
//     second, and reports its p99;
//
// and prints the highest rate whose lag p99 stayed under the bound (5 s), against the
// produce-only rate of the same run. Both nodes and the load generator share the
// machine, which is the point: it is the cost of the copy on one box.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/bench/proc"
)

type options struct {
	bin        string
	producers  int
	batch      int
	size       int
	partitions int
	duration   time.Duration
	bound      time.Duration
	fractions  string
}

func main() {
	var o options
	flag.StringVar(&o.bin, "narad", "", "path of the narad binary to start (required)")
	flag.IntVar(&o.producers, "producers", 8, "concurrent producers")
	flag.IntVar(&o.batch, "batch", 100, "messages per produce-batch request")
	flag.IntVar(&o.size, "size", 256, "payload bytes")
	flag.IntVar(&o.partitions, "partitions", 6, "partitions of the source and remote topics")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured window of each step")
	flag.DurationVar(&o.bound, "bound", 5*time.Second, "the copy's lag p99 must stay under this")
	flag.StringVar(&o.fractions, "fractions", "1.0,0.85,0.7,0.55,0.4,0.25", "fractions of the produce-only rate to try, highest first")
	flag.Parse()
	if o.bin == "" {
		fmt.Fprintln(os.Stderr, "narad-remote-bench: --narad is required")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "narad-remote-bench:", err)
		os.Exit(1)
	}
}

type node struct {
	base string
	p    *proc.Process
}

func launch(bin string) (*node, func(), error) {
	dir, err := os.MkdirTemp("", "narad-remote-bench-")
	if err != nil {
		return nil, nil, err
	}
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, nil, err
	}
	n := &node{base: "http://" + addr}
	log, err := os.Create(filepath.Join(dir, "narad.log"))
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(bin, "serve", "--http-addr", addr, "--data-dir", filepath.Join(dir, "data"), "--log-level", "warn")
	n.p, err = proc.Start(cmd, log, 30*time.Second, func(ctx context.Context) error {
		st, _, err := do(ctx, http.MethodGet, n.base+"/readyz", nil)
		if err == nil && st != http.StatusOK {
			err = fmt.Errorf("readyz: %d", st)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return n, func() { n.p.Stop(); _ = log.Close(); _ = os.RemoveAll(dir) }, nil
}

var hc = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}

func do(ctx context.Context, method, url string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func mustDo(method, url string, body any, want int) ([]byte, error) {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	st, out, err := do(context.Background(), method, url, b)
	if err != nil {
		return nil, err
	}
	if st != want {
		return nil, fmt.Errorf("%s %s: %d %s", method, url, st, out)
	}
	return out, nil
}

func run(o options) error {
	src, stopSrc, err := launch(o.bin)
	if err != nil {
		return err
	}
	defer stopSrc()
	dst, stopDst, err := launch(o.bin)
	if err != nil {
		return err
	}
	defer stopDst()

	payload := `{"p":"` + strings.Repeat("x", max(0, o.size-8)) + `"}`
	var msgs []string
	for range o.batch {
		msgs = append(msgs, `{"payload":`+payload+`}`)
	}
	body := []byte(`{"messages":[` + strings.Join(msgs, ",") + `]}`)

	// 1. Produce only, as fast as the producers go.
	if _, err := mustDo(http.MethodPost, src.base+"/v1/topics", map[string]any{"name": "only", "partitions": o.partitions}, http.StatusCreated); err != nil {
		return err
	}
	only, _ := produce(src.base+"/v1/topics/only/produce-batch", body, o, 0, nil)
	fmt.Printf("produce only (no child): %.0f msg/s  (%d producers, %d per request, %d B, %d partitions, %s)\n",
		only, o.producers, o.batch, o.size, o.partitions, o.duration)

	// 2. Fixed rates with a remote child, highest first.
	best := 0.0
	for i, fs := range strings.Split(o.fractions, ",") {
		var f float64
		if _, err := fmt.Sscanf(strings.TrimSpace(fs), "%g", &f); err != nil {
			return fmt.Errorf("--fractions: %q: %v", fs, err)
		}
		name := fmt.Sprintf("copied-%d", i)
		if _, err := mustDo(http.MethodPost, src.base+"/v1/topics", map[string]any{"name": name, "partitions": o.partitions}, http.StatusCreated); err != nil {
			return err
		}
		if _, err := mustDo(http.MethodPost, dst.base+"/v1/topics", map[string]any{"name": name, "partitions": o.partitions}, http.StatusCreated); err != nil {
			return err
		}
		out, err := mustDo(http.MethodPost, src.base+"/v1/topics/"+name+"/children", map[string]any{"child": name,
			"remote": map[string]any{"url": dst.base, "username": "bench", "password": "bench-password"}}, http.StatusCreated)
		if err != nil {
			return err
		}
		var child struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(out, &child); err != nil {
			return err
		}
		rate := f * only
		var lags []float64
		sample := func() {
			if l, err := lagSeconds(src.base, name, child.ID); err == nil {
				lags = append(lags, l)
			}
		}
		got, _ := produce(src.base+"/v1/topics/"+name+"/produce-batch", body, o, rate, sample)
		// The lag must also drain once the load stops: sample until it does (or the
		// bound twice over), so a copy that fell behind at the end is counted.
		deadline := time.Now().Add(2 * o.bound)
		for time.Now().Before(deadline) {
			sample()
			if lags[len(lags)-1] == 0 {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		p99, peak := percentile(lags, 0.99), percentile(lags, 1)
		ok := p99 < o.bound.Seconds()
		held, err1 := stored(src.base, name)
		copied, err2 := stored(dst.base, name)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		ok = ok && copied >= held
		fmt.Printf("with a remote child at %3.0f%% (%6.0f msg/s asked, %6.0f produced): copy lag p99 %.2f s, max %.2f s over %d samples; %d stored, %d in the remote: %s\n",
			100*f, rate, got, p99, peak, len(lags), held, copied, map[bool]string{true: "bounded", false: "NOT bounded"}[ok])
		if ok && got > best {
			best = got
			break
		}
	}
	if best == 0 {
		return errors.New("no rate tried kept the copy's lag under the bound")
	}
	// Produce only again: the machine is shared, so the ratio is against the mean of a
	// run before and a run after the copy.
	if _, err := mustDo(http.MethodPost, src.base+"/v1/topics", map[string]any{"name": "only-after", "partitions": o.partitions}, http.StatusCreated); err != nil {
		return err
	}
	after, _ := produce(src.base+"/v1/topics/only-after/produce-batch", body, o, 0, nil)
	fmt.Printf("produce only again: %.0f msg/s\n", after)
	mean := (only + after) / 2
	fmt.Printf("highest rate with the copy's lag p99 under %s: %.0f msg/s = %.0f%% of produce only (%.0f msg/s, the mean of before and after)\n", o.bound, best, 100*best/mean, mean)
	return nil
}

// produce runs the producers for o.duration, at most rate msg/s in total when rate > 0
// (each producer sends its share on a fixed schedule), calling sample every 250 ms. It
// returns the rate of messages answered 202.
func produce(url string, body []byte, o options, rate float64, sample func()) (float64, error) {
	var n atomic.Int64
	var firstErr atomic.Pointer[error]
	ctx, cancel := context.WithTimeout(context.Background(), o.duration)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range o.producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			every := time.Duration(0)
			if rate > 0 {
				every = time.Duration(float64(time.Second) * float64(o.batch) * float64(o.producers) / rate)
			}
			next := start.Add(time.Duration(i) * every / time.Duration(o.producers))
			for ctx.Err() == nil {
				if every > 0 {
					if d := time.Until(next); d > 0 {
						select {
						case <-ctx.Done():
							return
						case <-time.After(d):
						}
					}
					next = next.Add(every)
				}
				st, b, err := do(ctx, http.MethodPost, url, body)
				if err == nil && st != http.StatusAccepted {
					err = fmt.Errorf("produce-batch: %d %s", st, b)
				}
				if err != nil {
					if ctx.Err() == nil {
						firstErr.CompareAndSwap(nil, &err)
					}
					continue
				}
				n.Add(int64(o.batch))
			}
		}()
	}
	if sample != nil {
		tick := time.NewTicker(250 * time.Millisecond)
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case <-tick.C:
				sample()
			}
		}
		tick.Stop()
	}
	wg.Wait()
	got := float64(n.Load()) / time.Since(start).Seconds()
	if e := firstErr.Load(); e != nil {
		return got, *e
	}
	return got, nil
}

// stored is how many messages a topic holds (the sum of its partitions' next offsets).
func stored(base, topic string) (int64, error) {
	st, b, err := do(context.Background(), http.MethodGet, base+"/v1/topics/"+topic, nil)
	if err != nil || st != http.StatusOK {
		return 0, fmt.Errorf("topic %s: %d %v", topic, st, err)
	}
	var t struct {
		PartitionStats []struct {
			NextOffset int64 `json:"next_offset"`
		} `json:"partition_stats"`
	}
	if err := json.Unmarshal(b, &t); err != nil {
		return 0, err
	}
	n := int64(0)
	for _, p := range t.PartitionStats {
		n += p.NextOffset
	}
	return n, nil
}

// lagSeconds is the largest lag_seconds over the child's partitions.
func lagSeconds(base, topic, id string) (float64, error) {
	st, b, err := do(context.Background(), http.MethodGet, base+"/v1/topics/"+topic+"/children", nil)
	if err != nil || st != http.StatusOK {
		return 0, fmt.Errorf("children: %d %v", st, err)
	}
	var l struct {
		Children []struct {
			ID  string `json:"id"`
			Lag []struct {
				LagSeconds float64 `json:"lag_seconds"`
			} `json:"lag"`
		} `json:"children"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return 0, err
	}
	for _, c := range l.Children {
		if c.ID == id {
			m := 0.0
			for _, p := range c.Lag {
				m = math.Max(m, p.LagSeconds)
			}
			return m, nil
		}
	}
	return 0, fmt.Errorf("child %s not listed", id)
}

func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.Inf(1)
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)]
}
