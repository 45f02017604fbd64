package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/bench/proc"
)

// rssInterval is how often the server's RSS is sampled during a shape.
const rssInterval = 100 * time.Millisecond

// errorPause keeps a failing loop from spinning on a broker that refuses everything.
const errorPause = 10 * time.Millisecond

// Run runs shapes against t in order and returns one Result per shape run. A shape
// the target cannot run (fan-out without Fanouter) is skipped. It stops at the first
// shape that could not run at all (the queue could not be created); failed requests
// inside a shape are counted, not fatal.
func Run(ctx context.Context, t Target, shapes []string, o Options) ([]Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	r := &runner{t: t, o: o}
	var out []Result
	for _, s := range shapes {
		if s == ShapeLatency && o.Rate == 0 && r.produceRate == 0 {
			res, err := r.shape(ctx, ShapeProduce)
			if err != nil {
				return out, err
			}
			out = append(out, res)
		}
		if s == ShapeFanout {
			if _, ok := t.(Fanouter); !ok {
				continue
			}
		}
		res, err := r.shape(ctx, s)
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

type runner struct {
	t           Target
	o           Options
	cur         string  // the shape running
	produceRate float64 // of the last produce shape, for the latency shape's default rate
	flowRate    float64 // acked/s of the last flow shape, preferred for that default
}

func (r *runner) shape(ctx context.Context, s string) (Result, error) {
	var (
		res Result
		err error
	)
	r.cur = s
	switch s {
	case ShapeProduce:
		res, err = r.produce(ctx)
		if err == nil {
			r.produceRate = res.ProducedRate
		}
	case ShapeFlow:
		res, err = r.flow(ctx, false)
		if err == nil {
			r.flowRate = res.AckedRate
		}
	case ShapeBatch:
		res, err = r.flow(ctx, true)
	case ShapeLatency:
		// The latency shape produces, consumes and acks, so its maximum is the full
		// flow's; half of the produce-only rate would overload a broker whose acks are
		// durable writes too.
		rate := r.o.Rate
		switch {
		case rate == 0 && r.flowRate > 0:
			rate = r.flowRate / 2
		case rate == 0:
			rate = r.produceRate / 2
		}
		res, err = r.openLoop(ctx, ShapeLatency, rate, r.o.Producers)
	case ShapeWakeup:
		res, err = r.openLoop(ctx, ShapeWakeup, r.o.WakeRate, 1)
	case ShapeFanout:
		res, err = r.fanout(ctx)
	default:
		return Result{}, fmt.Errorf("unknown shape %q", s)
	}
	if ob, ok := r.t.(Observer); ok {
		ob.ShapeEnded(s)
	}
	if err != nil {
		return res, fmt.Errorf("%s %s: %w", r.t.Name(), s, err)
	}
	res.Target, res.Shape = r.t.Name(), s
	fmt.Fprintln(r.o.Log, progressLine(res))
	return res, nil
}

// phase is the shared state of one shape while it runs.
type phase struct {
	o        Options
	tr       Tracker
	start    time.Time
	self     *proc.Sampler // the benchmark process, which shares the machine
	stop     atomic.Bool   // producers stop at the end of the window
	produced atomic.Int64
	acked    atomic.Int64
	errs     atomic.Int64
	errOnce  sync.Once
	firstErr string
}

func (p *phase) fail(err error) {
	p.errs.Add(1)
	p.errOnce.Do(func() { p.firstErr = err.Error() })
	time.Sleep(errorPause)
}

// payloads returns n payloads of the option's size, each to carry its own id.
func (p *phase) payloads(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		b := make([]byte, p.o.Size)
		for j := IDSize; j < len(b); j++ {
			b[j] = 'x'
		}
		out[i] = b
	}
	return out
}

// begin opens the queue and starts the clock and the server sampler.
func (r *runner) begin(ctx context.Context) (*phase, Queue, serverSampler, error) {
	q, err := r.t.Open(ctx, r.o.Partitions)
	if err != nil {
		return nil, nil, nil, err
	}
	p := &phase{o: r.o}
	return p, q, r.startClock(p), nil
}

// startClock tells a target that observes its shapes, then starts p's window: what
// the observer does (a cluster scrapes every node's /metrics) is not in the window.
func (r *runner) startClock(p *phase) serverSampler {
	if ob, ok := r.t.(Observer); ok {
		ob.ShapeStarted(r.cur, r.o.Duration)
	}
	return p.startClock(r.t)
}

// startClock starts the window, the server's samplers and the benchmark's own.
func (p *phase) startClock(t Target) serverSampler {
	p.self = proc.Sample(os.Getpid(), rssInterval)
	s := sampleServer(t)
	p.start = time.Now()
	return s
}

// serverSampler watches every process of the target's server.
type serverSampler []*proc.Sampler

// sampleServer samples the target's processes: PIDs of a Processes, else PID.
func sampleServer(t Target) serverSampler {
	pids := []int{t.PID()}
	if m, ok := t.(Processes); ok {
		pids = m.PIDs()
	}
	s := make(serverSampler, len(pids))
	for i, pid := range pids {
		s[i] = proc.Sample(pid, rssInterval)
	}
	return s
}

// Stop adds up the processes' usage: CPU cores, and RSS peaks and last values (the
// sum of each process's own peak, which the processes need not reach at the same
// moment). ok is false when any process could not be read.
func (s serverSampler) Stop() (proc.Usage, bool) {
	var sum proc.Usage
	ok := len(s) > 0
	for _, x := range s {
		u, good := x.Stop()
		ok = ok && good
		sum.CPU += u.CPU
		sum.RSSPeak += u.RSSPeak
		sum.RSSLast += u.RSSLast
	}
	return sum, ok
}

// end closes the window: rates over the time since start, the server's usage.
func (p *phase) end(res *Result, s serverSampler) {
	res.Window = time.Since(p.start)
	res.Produced, res.Acked = p.produced.Load(), p.acked.Load()
	sec := res.Window.Seconds()
	res.ProducedRate = float64(res.Produced) / sec
	res.AckedRate = float64(res.Acked) / sec
	res.PayloadMBps = float64(res.Produced) * float64(p.o.Size) / sec / 1e6
	if u, ok := s.Stop(); ok {
		res.Usage = &u
	}
	if u, ok := p.self.Stop(); ok {
		res.Client = &u
	}
}

func (p *phase) finish(ctx context.Context, res *Result, q Queue) {
	res.Errors, res.FirstError = p.errs.Load(), p.firstErr
	if err := q.Delete(ctx); err != nil {
		res.Errors++
		if res.FirstError == "" {
			res.FirstError = "delete: " + err.Error()
		}
	}
}

// hardBound is the longest any request of a shape may take before the shape gives up:
// a broker that hangs ends the run with errors instead of hanging it.
func (o Options) hardBound() time.Duration { return o.Duration + o.Drain + 60*time.Second }

// closedLoop runs n producers that send as fast as the broker confirms, batch
// messages per request (batch 1 uses Produce), until p.stop.
func (p *phase) closedLoop(ctx context.Context, q Queue, n, batch int, rec []*Recorder) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			pr := q.Producer(i)
			bufs := p.payloads(batch)
			for !p.stop.Load() && ctx.Err() == nil {
				first := p.tr.Reserve(batch)
				for j, b := range bufs {
					PutID(b, first+uint64(j))
				}
				t0 := time.Now()
				var err error
				if batch == 1 {
					err = pr.Produce(ctx, bufs[0])
				} else {
					err = pr.ProduceBatch(ctx, bufs)
				}
				if err != nil {
					p.fail(err)
					continue
				}
				rec[i].Add(time.Since(t0))
				for j := range bufs {
					p.tr.Confirm(first + uint64(j))
				}
				p.produced.Add(int64(batch))
			}
		}(i)
	}
	return &wg
}

// consumed is one message a consumer took: when its consume was sent and answered.
type consumed struct {
	id         uint64
	start, end time.Time
}

// consumers runs n consumers, each consuming up to maxN per request and acking what it
// got in one request, until the returned stop is called. Stop lets the long polls in
// flight end on their own (a broker sees a client that stops asking, not one that
// hangs up mid-request), and cancels them only if they outlast the wait by far.
// When record is set, every delivery is kept for the latency shapes.
func (p *phase) consumers(ctx context.Context, q Queue, n, maxN int, clat, alat []*Recorder, record [][]consumed) (stop func()) {
	cctx, cancel := context.WithCancel(ctx)
	var (
		quit atomic.Bool
		wg   sync.WaitGroup
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := q.Consumer(i, n)
			for !quit.Load() && cctx.Err() == nil {
				t0 := time.Now()
				ds, err := c.Consume(cctx, maxN, p.o.Wait)
				if cctx.Err() != nil {
					return
				}
				if err != nil {
					p.fail(err)
					continue
				}
				if len(ds) == 0 {
					continue
				}
				t1 := time.Now()
				clat[i].Add(t1.Sub(t0))
				for _, d := range ds {
					id, ok := p.tr.Deliver(d.Payload)
					if ok && record != nil {
						record[i] = append(record[i], consumed{id: id, start: t0, end: t1})
					}
				}
				t2 := time.Now()
				acked, err := c.Ack(cctx, ds)
				if err != nil && cctx.Err() != nil {
					return
				}
				alat[i].Add(time.Since(t2))
				p.acked.Add(int64(acked))
				if err != nil {
					// One error per entry that was not settled, at least one.
					p.errs.Add(int64(max(len(ds)-acked, 1) - 1))
					p.fail(err)
				}
			}
		}(i)
	}
	return func() {
		quit.Store(true)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(p.o.Wait + 5*time.Second):
			cancel()
			<-done
		}
		cancel()
	}
}

// drain waits until every confirmed message was delivered or the Drain bound passed.
func (p *phase) drain(ctx context.Context, res *Result) {
	t0 := time.Now()
	deadline := t0.Add(p.o.Drain)
	for !p.tr.AllDelivered() && ctx.Err() == nil {
		if time.Now().After(deadline) {
			res.DrainTimedOut = true
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	res.Drain = time.Since(t0)
}

// produce: producers only, one message per request, as fast as confirmed.
func (r *runner) produce(ctx context.Context) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, r.o.hardBound())
	defer cancel()
	p, q, s, err := r.begin(ctx)
	if err != nil {
		return Result{}, err
	}
	var res Result
	plat := recorders(r.o.Producers)
	wg := p.closedLoop(ctx, q, r.o.Producers, 1, plat)
	time.AfterFunc(r.o.Duration, func() { p.stop.Store(true) })
	wg.Wait()
	p.end(&res, s)
	res.Latencies = []Latency{{OpProduce, Summarize(plat...)}}
	p.finish(ctx, &res, q)
	return res, nil
}

// flow: producers and consumers together, then a drain and the account of every
// message. batched sends Batch messages per produce, consume and ack request.
func (r *runner) flow(ctx context.Context, batched bool) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, r.o.hardBound())
	defer cancel()
	batch, pop, cop, aop := 1, OpProduce, OpConsume, OpAck
	if batched {
		batch, pop, cop, aop = r.o.Batch, OpProduceBatch, OpConsumeBatch, OpAckBatch
	}
	p, q, s, err := r.begin(ctx)
	if err != nil {
		return Result{}, err
	}
	var res Result
	plat, clat, alat := recorders(r.o.Producers), recorders(r.o.Consumers), recorders(r.o.Consumers)
	stopConsumers := p.consumers(ctx, q, r.o.Consumers, batch, clat, alat, nil)
	wg := p.closedLoop(ctx, q, r.o.Producers, batch, plat)
	time.AfterFunc(r.o.Duration, func() { p.stop.Store(true) })
	wg.Wait()
	p.end(&res, s)
	p.drain(ctx, &res)
	stopConsumers()
	c := p.tr.Check()
	res.Check = &c
	res.Latencies = []Latency{{pop, Summarize(plat...)}, {cop, Summarize(clat...)}, {aop, Summarize(alat...)}}
	p.finish(ctx, &res, q)
	return res, nil
}

// confirmedAt is when a producer of an open-loop shape read the confirmation of id.
type confirmedAt struct {
	id uint64
	at time.Time
}

// backlog produces n messages in batches before the clock starts and returns when
// each was confirmed.
func (p *phase) backlog(ctx context.Context, q Queue, n, producers int) ([]confirmedAt, error) {
	var (
		mu   sync.Mutex
		out  []confirmedAt
		left atomic.Int64
		wg   sync.WaitGroup
		errs atomic.Int64
	)
	left.Store(int64(n))
	for i := 0; i < producers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			pr := q.Producer(i)
			bufs := p.payloads(p.o.Batch)
			for ctx.Err() == nil && errs.Load() < 10 {
				k := int(min(left.Add(-int64(p.o.Batch))+int64(p.o.Batch), int64(p.o.Batch)))
				if k <= 0 {
					return
				}
				first := p.tr.Reserve(k)
				for j := 0; j < k; j++ {
					PutID(bufs[j], first+uint64(j))
				}
				if err := pr.ProduceBatch(ctx, bufs[:k]); err != nil {
					errs.Add(1)
					p.fail(err)
					left.Add(int64(k))
					continue
				}
				now := time.Now()
				mu.Lock()
				for j := 0; j < k; j++ {
					p.tr.Confirm(first + uint64(j))
					out = append(out, confirmedAt{first + uint64(j), now})
				}
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	if errs.Load() >= 10 {
		return nil, fmt.Errorf("could not produce the backlog: %s", p.firstErr)
	}
	return out, ctx.Err()
}

// openLoop sends at a fixed rate whatever the answers, spread over producers
// goroutines, each on its own schedule. A produce's latency counts from the time it
// was scheduled, so a broker that falls behind shows it (no coordinated omission).
// Consumers take one message per request and ack it.
//
// Every delivery is classified by when its produce was confirmed:
//
//   - available: confirmed before the consume was sent. The latency shape reports the
//     consume latency of these (request to answer); it starts with a backlog of one
//     second of its rate, produced in batches before the clock starts, so consumers
//     find messages waiting even when they keep up with the producers.
//   - woken: confirmed after the consume was sent, so the consumer was parked in its
//     long poll. The wake-up shape reports, for these, the time from the
//     confirmation to the consume's answer, clamped at 0 because the broker may
//     answer the consumer a moment before the producer.
func (r *runner) openLoop(ctx context.Context, shape string, rate float64, producers int) (Result, error) {
	if rate <= 0 {
		return Result{}, errors.New("no rate: give one, or run the produce shape first")
	}
	ctx, cancel := context.WithTimeout(ctx, r.o.hardBound())
	defer cancel()
	q, err := r.t.Open(ctx, r.o.Partitions)
	if err != nil {
		return Result{}, err
	}
	p := &phase{o: r.o}
	conf := make([][]confirmedAt, producers+1)
	if shape == ShapeLatency {
		if conf[producers], err = p.backlog(ctx, q, int(min(rate, 100000)), r.o.Producers); err != nil {
			return Result{}, err
		}
	}
	s := r.startClock(p)
	res := Result{OfferedRate: rate}
	plat, clat, alat := recorders(producers), recorders(r.o.Consumers), recorders(r.o.Consumers)
	got := make([][]consumed, r.o.Consumers)
	stopConsumers := p.consumers(ctx, q, r.o.Consumers, 1, clat, alat, got)

	interval := time.Duration(float64(producers) / rate * float64(time.Second))
	var wg sync.WaitGroup
	for i := 0; i < producers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			pr := q.Producer(i)
			buf := p.payloads(1)[0]
			next := p.start.Add(interval * time.Duration(i) / time.Duration(producers))
			for !p.stop.Load() && ctx.Err() == nil {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				id := p.tr.Reserve(1)
				PutID(buf, id)
				err := pr.Produce(ctx, buf)
				now := time.Now()
				sched := next
				next = next.Add(interval)
				if err != nil {
					p.fail(err)
					continue
				}
				plat[i].Add(now.Sub(sched))
				conf[i] = append(conf[i], confirmedAt{id, now})
				p.tr.Confirm(id)
				p.produced.Add(1)
			}
		}(i)
	}
	time.AfterFunc(r.o.Duration, func() { p.stop.Store(true) })
	wg.Wait()
	p.end(&res, s)
	p.drain(ctx, &res)
	stopConsumers()
	c := p.tr.Check()
	res.Check = &c

	at := make([]time.Time, c.Reserved)
	for _, cs := range conf {
		for _, x := range cs {
			at[x.id] = x.at
		}
	}
	var avail, woken Recorder
	for _, gs := range got {
		for _, g := range gs {
			a := at[g.id]
			switch {
			case a.IsZero(): // produce not confirmed
			case !a.After(g.start):
				avail.Add(g.end.Sub(g.start))
			default:
				woken.Add(max(0, g.end.Sub(a)))
			}
		}
	}
	if shape == ShapeLatency {
		res.Latencies = []Latency{{OpProduce, Summarize(plat...)}, {OpConsumeAvail, Summarize(&avail)}, {OpAck, Summarize(alat...)}}
	} else {
		res.Latencies = []Latency{{OpProduce, Summarize(plat...)}, {OpWakeup, Summarize(&woken)}, {OpConsumeAvail, Summarize(&avail)}}
	}
	p.finish(ctx, &res, q)
	return res, nil
}

// fanout: producers into a parent with children; the copy rate, the largest total lag
// seen while producing, and how long the children took to catch up.
func (r *runner) fanout(ctx context.Context) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, r.o.hardBound())
	defer cancel()
	q, lag, err := r.t.(Fanouter).OpenFanout(ctx, r.o.Partitions, r.o.Children)
	if err != nil {
		return Result{}, err
	}
	p := &phase{o: r.o}
	s := r.startClock(p)
	res := Result{Fanout: &Fanout{Children: r.o.Children}}
	plat := recorders(r.o.Producers)
	wg := p.closedLoop(ctx, q, r.o.Producers, 1, plat)
	deadline := p.start.Add(r.o.Duration)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if l, _, err := lag(ctx); err == nil && l > res.Fanout.MaxLag {
			res.Fanout.MaxLag = l
		}
		time.Sleep(min(200*time.Millisecond, time.Until(deadline)))
	}
	p.stop.Store(true)
	wg.Wait()
	p.end(&res, s)
	produced := time.Now()
	limit := produced.Add(r.o.Drain)
	for {
		l, _, err := lag(ctx)
		if err == nil && l == 0 {
			break
		}
		if time.Now().After(limit) || ctx.Err() != nil {
			res.Fanout.CaughtUpTimedOut = true
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.Fanout.CaughtUp = time.Since(produced)
	if _, copied, err := lag(ctx); err == nil {
		res.Fanout.CopiesRate = float64(copied) / time.Since(p.start).Seconds()
	}
	res.Latencies = []Latency{{OpProduce, Summarize(plat...)}}
	p.finish(ctx, &res, q)
	return res, nil
}
