// Command narad-bench is the load generator behind `make bench`: it starts a narad node
// (or uses --target), drives it over HTTP with concurrent producers and consumers, and
// prints throughput and latency percentiles beside the machine's fsync rate measured in
// the same run.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type config struct {
	narad      string
	target     string
	producers  int
	consumers  int
	size       int
	partitions int
	duration   time.Duration
	mode       string
	batch      int
}

func main() {
	var c config
	flag.StringVar(&c.narad, "narad", "", "path of the narad binary to start (ignored with --target)")
	flag.StringVar(&c.target, "target", "", "base URL of a running node, e.g. http://127.0.0.1:7942")
	flag.IntVar(&c.producers, "producers", 16, "concurrent producers")
	flag.IntVar(&c.consumers, "consumers", 16, "concurrent consumers")
	flag.IntVar(&c.size, "size", 256, "message size in bytes")
	flag.IntVar(&c.partitions, "partitions", 6, "partitions of the benchmark topic")
	flag.DurationVar(&c.duration, "duration", 10*time.Second, "how long each phase runs")
	flag.StringVar(&c.mode, "mode", "all", "produce, flow, batch, fanout or all")
	flag.IntVar(&c.batch, "batch", 100, "messages per request in batch mode")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "narad-bench:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	dir, err := os.MkdirTemp("", "narad-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Printf("machine: fsync rate %.0f fsyncs/s (256-byte write + fsync, in %s)\n", fsyncRate(dir, 2*time.Second), dir)

	base := c.target
	if base == "" {
		if c.narad == "" {
			return errors.New("give --narad (a binary to start) or --target (a running node)")
		}
		stop, url, err := startNode(c.narad, filepath.Join(dir, "data"))
		if err != nil {
			return err
		}
		defer stop()
		base = url
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}}
	b := &bench{c: c, base: base, http: client, payload: bytes.Repeat([]byte("x"), c.size)}
	fmt.Printf("setup: %d producers, %d consumers, %d-byte messages, %d partitions, %s per phase, every 202 and 204 durable\n",
		c.producers, c.consumers, c.size, c.partitions, c.duration)
	if c.mode == "produce" || c.mode == "all" {
		if err := b.produceOnly(); err != nil {
			return err
		}
	}
	if c.mode == "flow" || c.mode == "all" {
		if err := b.flow(); err != nil {
			return err
		}
	}
	if c.mode == "batch" || c.mode == "all" {
		if err := b.batchFlow(); err != nil {
			return err
		}
	}
	if c.mode == "fanout" || c.mode == "all" {
		if err := b.fanout(3); err != nil {
			return err
		}
	}
	return nil
}

func fsyncRate(dir string, d time.Duration) float64 {
	f, err := os.Create(filepath.Join(dir, "fsync-probe"))
	if err != nil {
		return 0
	}
	defer f.Close()
	buf := make([]byte, 256)
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		f.Write(buf)
		f.Sync()
		n++
	}
	return float64(n) / time.Since(start).Seconds()
}

func startNode(bin, dataDir string) (func(), string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "serve", "--http-addr", addr, "--data-dir", dataDir, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return stop, base, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	return nil, "", errors.New("narad did not become ready in 30s")
}

type bench struct {
	c       config
	base    string
	http    *http.Client
	payload []byte
	seq     atomic.Int64
}

func (b *bench) createTopic() (string, error) {
	name := fmt.Sprintf("bench-%d", b.seq.Add(1))
	body, _ := json.Marshal(map[string]any{"name": name, "partitions": b.c.partitions, "max_in_flight_per_partition": 100000, "max_acked_ahead_per_partition": 100000})
	resp, err := b.http.Post(b.base+"/v1/topics", "application/json", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 201 {
		msg, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("create topic: %d %s", resp.StatusCode, msg)
	}
	return name, nil
}

// do sends one request and returns its status and body.
func (b *bench) do(method, url, ctype string, body []byte) (int, []byte, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, data, err
}

type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) pct(p float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	sort.Slice(l.d, func(i, j int) bool { return l.d[i] < l.d[j] })
	return l.d[int(float64(len(l.d)-1)*p)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

func (b *bench) producers(ctx context.Context, topic string, lat *latencies, count *atomic.Int64, errs *atomic.Int64) *sync.WaitGroup {
	var wg sync.WaitGroup
	u := b.base + "/v1/topics/" + topic + "/produce"
	for i := 0; i < b.c.producers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				t := time.Now()
				st, _, err := b.do("POST", u, "application/octet-stream", b.payload)
				if err != nil || st != 202 {
					errs.Add(1)
					continue
				}
				lat.add(time.Since(t))
				count.Add(1)
			}
		}()
	}
	return &wg
}

func (b *bench) produceOnly() error {
	topic, err := b.createTopic()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.c.duration)
	defer cancel()
	var lat latencies
	var n, errs atomic.Int64
	start := time.Now()
	b.producers(ctx, topic, &lat, &n, &errs).Wait()
	el := time.Since(start).Seconds()
	fmt.Printf("produce-only:  %8.0f msg/s  produce p50 %s p99 %s  (%d messages, %d errors)\n",
		float64(n.Load())/el, ms(lat.pct(.5)), ms(lat.pct(.99)), n.Load(), errs.Load())
	return nil
}

type consumed struct {
	ReceiptHandle string `json:"receipt_handle"`
}

func (b *bench) flow() error {
	topic, err := b.createTopic()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.c.duration)
	defer cancel()
	var plat, clat, alat latencies
	var produced, acked, errs atomic.Int64
	start := time.Now()
	pw := b.producers(ctx, topic, &plat, &produced, &errs)
	var cw sync.WaitGroup
	cu := b.base + "/v1/topics/" + topic + "/consume?wait=1s"
	au := b.base + "/v1/topics/" + topic + "/ack?receipt_handle="
	for i := 0; i < b.c.consumers; i++ {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for ctx.Err() == nil {
				t := time.Now()
				st, body, err := b.do("GET", cu, "", nil)
				if err != nil || (st != 200 && st != 204) {
					errs.Add(1)
					continue
				}
				if st == 204 {
					continue
				}
				clat.add(time.Since(t))
				var m consumed
				if err := json.Unmarshal(body, &m); err != nil {
					errs.Add(1)
					continue
				}
				t = time.Now()
				st, _, err = b.do("POST", au+url.QueryEscape(m.ReceiptHandle), "", nil)
				if err != nil || st != 204 {
					errs.Add(1)
					continue
				}
				alat.add(time.Since(t))
				acked.Add(1)
			}
		}()
	}
	pw.Wait()
	cw.Wait()
	el := time.Since(start).Seconds()
	fmt.Printf("full flow:     %8.0f msg/s acked (%8.0f msg/s produced)  produce p50 %s p99 %s  consume p50 %s p99 %s  ack p50 %s p99 %s  (%d errors)\n",
		float64(acked.Load())/el, float64(produced.Load())/el, ms(plat.pct(.5)), ms(plat.pct(.99)),
		ms(clat.pct(.5)), ms(clat.pct(.99)), ms(alat.pct(.5)), ms(alat.pct(.99)), errs.Load())
	return nil
}

func (b *bench) batchFlow() error {
	topic, err := b.createTopic()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.c.duration)
	defer cancel()
	type out struct {
		Payload []byte `json:"payload"`
		Enc     string `json:"payload_encoding"`
	}
	msgs := make([]out, b.c.batch)
	for i := range msgs {
		msgs[i] = out{Payload: b.payload, Enc: "base64"}
	}
	body, _ := json.Marshal(map[string]any{"messages": msgs})
	var plat latencies
	var produced, acked, errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	pu := b.base + "/v1/topics/" + topic + "/produce-batch"
	for i := 0; i < b.c.producers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				t := time.Now()
				st, _, err := b.do("POST", pu, "application/json", body)
				if err != nil || st != 202 {
					errs.Add(1)
					continue
				}
				plat.add(time.Since(t))
				produced.Add(int64(b.c.batch))
			}
		}()
	}
	cu := fmt.Sprintf("%s/v1/topics/%s/consume-batch?max=%d&wait=1s", b.base, topic, b.c.batch)
	au := b.base + "/v1/topics/" + topic + "/ack-batch"
	for i := 0; i < b.c.consumers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				st, data, err := b.do("GET", cu, "", nil)
				if err != nil || (st != 200 && st != 204) {
					errs.Add(1)
					continue
				}
				if st == 204 {
					continue
				}
				var got struct{ Messages []consumed }
				if err := json.Unmarshal(data, &got); err != nil {
					errs.Add(1)
					continue
				}
				acks := make([]map[string]string, len(got.Messages))
				for j, m := range got.Messages {
					acks[j] = map[string]string{"receipt_handle": m.ReceiptHandle}
				}
				ab, _ := json.Marshal(map[string]any{"acks": acks})
				st, _, err = b.do("POST", au, "application/json", ab)
				if err != nil || st != 200 {
					errs.Add(1)
					continue
				}
				acked.Add(int64(len(acks)))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	fmt.Printf("batched flow:  %8.0f msg/s acked (%8.0f msg/s produced, %.1f MB/s of payload)  produce-batch p50 %s p99 %s  (%d per request, %d errors)\n",
		float64(acked.Load())/el, float64(produced.Load())/el, float64(produced.Load())*float64(b.c.size)/el/1e6,
		ms(plat.pct(.5)), ms(plat.pct(.99)), b.c.batch, errs.Load())
	return nil
}

// fanout produces into a parent with children attached and reports how fast the
// copies keep up: the largest total lag seen while producing, and the copy rate.
func (b *bench) fanout(children int) error {
	parent, err := b.createTopic()
	if err != nil {
		return err
	}
	for i := 0; i < children; i++ {
		child, err := b.createTopic()
		if err != nil {
			return err
		}
		body, _ := json.Marshal(map[string]any{"child": child})
		st, msg, err := b.do("POST", b.base+"/v1/topics/"+parent+"/children", "application/json", body)
		if err != nil || st != 201 {
			return fmt.Errorf("attach: %d %s %v", st, msg, err)
		}
	}
	lag := func() (int64, int64) {
		st, data, err := b.do("GET", b.base+"/v1/topics/"+parent+"/children", "", nil)
		if err != nil || st != 200 {
			return -1, -1
		}
		var l struct {
			Children []struct {
				Lag []struct {
					Lag         int64 `json:"lag"`
					ChildCursor int64 `json:"child_cursor"`
				} `json:"lag"`
			} `json:"children"`
		}
		json.Unmarshal(data, &l)
		var total, copied int64
		for _, c := range l.Children {
			for _, p := range c.Lag {
				total += p.Lag
				copied += p.ChildCursor
			}
		}
		return total, copied
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.c.duration)
	defer cancel()
	var plat latencies
	var n, errs atomic.Int64
	start := time.Now()
	pw := b.producers(ctx, parent, &plat, &n, &errs)
	var maxLag int64
	for ctx.Err() == nil {
		if l, _ := lag(); l > maxLag {
			maxLag = l
		}
		time.Sleep(200 * time.Millisecond)
	}
	pw.Wait()
	produced := time.Since(start)
	for {
		l, _ := lag()
		if l == 0 || time.Since(start) > produced+60*time.Second {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	caught := time.Since(start)
	_, copied := lag()
	fmt.Printf("fan-out:       %8.0f msg/s into the parent, %d children: %8.0f copies/s, max total lag %d messages, all caught up %s after the last produce  (%d errors)\n",
		float64(n.Load())/produced.Seconds(), children, float64(copied)/caught.Seconds(), maxLag, (caught - produced).Round(time.Millisecond), errs.Load())
	return nil
}
