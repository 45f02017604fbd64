package narad

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/narad-mq/narad/sdk-go/api"
)

// PublisherOption configures a Publisher.
type PublisherOption func(*publisherConfig)

type publisherConfig struct {
	count       int
	bytes       int
	linger      time.Duration
	buffer      int
	nonBlocking bool
	inFlight    int
	noDup       bool
}

// WithBatchCount sends a batch once it holds n messages (default 100, at most 1000).
func WithBatchCount(n int) PublisherOption {
	return func(c *publisherConfig) { c.count = min(max(n, 1), MaxBatchMessages) }
}

// WithBatchBytes sends a batch once its payloads reach n bytes (default 1 MiB, at most 7 MiB).
func WithBatchBytes(n int) PublisherOption {
	return func(c *publisherConfig) { c.bytes = min(max(n, 1), maxBatchBody) }
}

// WithLinger waits up to d after a batch's first message for more before sending it
// (default 5 ms). 0 sends whatever is buffered as soon as the sender is free.
func WithLinger(d time.Duration) PublisherOption {
	return func(c *publisherConfig) { c.linger = max(d, 0) }
}

// WithBufferSize bounds the messages buffered or in flight (default 10000). When it is
// full, Publish blocks, or fails with ErrBufferFull under WithNonBlocking.
func WithBufferSize(n int) PublisherOption {
	return func(c *publisherConfig) { c.buffer = max(n, 1) }
}

// WithNonBlocking makes Publish fail at once with ErrBufferFull instead of blocking when
// the buffer is full.
func WithNonBlocking() PublisherOption {
	return func(c *publisherConfig) { c.nonBlocking = true }
}

// WithInFlightBatches sends up to n batches at once (default 1, which keeps the order of
// messages of one key; more is faster and may reorder on retries).
func WithInFlightBatches(n int) PublisherOption {
	return func(c *publisherConfig) { c.inFlight = max(n, 1) }
}

// WithPublisherNoDuplicates fails a batch whose outcome is unknown instead of retrying it
// (see NoDuplicates).
func WithPublisherNoDuplicates() PublisherOption {
	return func(c *publisherConfig) { c.noDup = true }
}

// Publisher batches messages to one topic by count, bytes and linger, with a bounded
// buffer, and reports a result per message. A batch the broker refuses whole for one
// of its messages (400, such as a schema violation, or 413) is sent again one message
// at a time, so that only that message fails. It is safe for concurrent use. Close it to
// send what is buffered.
type Publisher struct {
	c     *Client
	topic string
	cfg   publisherConfig

	slots   chan struct{}
	in      chan *Pending
	cut     chan struct{}
	batches chan []*Pending
	stop    chan struct{}
	wg      sync.WaitGroup

	mu          sync.Mutex
	closed      bool
	outstanding map[*Pending]struct{}
	closeOnce   sync.Once
}

// Pending is the future result of one published message.
type Pending struct {
	done     chan struct{}
	produced Produced
	err      error
	wire     api.OutgoingMessage
	size     int
	noDup    bool
}

// Done is closed once the result is known.
func (r *Pending) Done() <-chan struct{} { return r.done }

// Result returns the outcome; call it after Done is closed (before, it reports ErrTimeout).
func (r *Pending) Result() (Produced, error) {
	select {
	case <-r.done:
		return r.produced, r.err
	default:
		return Produced{}, &Error{Op: "publish", kind: ErrTimeout, Message: "the result is not known yet"}
	}
}

// Wait waits for the outcome or for ctx to end.
func (r *Pending) Wait(ctx context.Context) (Produced, error) {
	select {
	case <-r.done:
		return r.produced, r.err
	case <-ctx.Done():
		return Produced{}, ctx.Err()
	}
}

// Publisher returns a batching producer for topic. It starts its goroutines at once.
func (c *Client) Publisher(topic string, opts ...PublisherOption) *Publisher {
	cfg := publisherConfig{count: 100, bytes: 1 << 20, linger: DefaultLinger, buffer: 10000, inFlight: 1}
	for _, o := range opts {
		o(&cfg)
	}
	p := &Publisher{
		c: c, topic: topic, cfg: cfg,
		slots:       make(chan struct{}, cfg.buffer),
		in:          make(chan *Pending, cfg.buffer),
		cut:         make(chan struct{}, 1),
		batches:     make(chan []*Pending),
		stop:        make(chan struct{}),
		outstanding: make(map[*Pending]struct{}),
	}
	p.wg.Add(1 + cfg.inFlight)
	go p.collect()
	for i := 0; i < cfg.inFlight; i++ {
		go p.send()
	}
	return p
}

// Publish buffers one message (encoded as for Produce; WithKey, WithPartition,
// WithContentType and NoDuplicates apply) and returns its future result. A message
// published with NoDuplicates makes the whole batch it travels in fail rather than be
// retried when the batch's outcome is unknown. It blocks while the buffer is full (or fails with
// ErrBufferFull under WithNonBlocking), and fails with ErrClosed after Close.
func (p *Publisher) Publish(ctx context.Context, body any, opts ...ProduceOption) (*Pending, error) {
	var pc produceConfig
	for _, o := range opts {
		o(&pc)
	}
	out := Outgoing{Body: body}
	if pc.hasKey {
		out.Key = pc.key
	}
	if pc.pinned {
		out.Partition = Pin(pc.partition)
	}
	w, n, err := outgoingWireAs(out, pc.contentType)
	if err != nil {
		return nil, &Error{Op: "publish", Topic: p.topic, Err: err, Message: err.Error(), kind: ErrBadRequest}
	}
	size := len(w.Payload) + len(pc.key) + 64
	if size > maxBatchBody || n > MaxMessageBytes {
		return nil, &Error{Op: "publish", Topic: p.topic, Message: "the message is over the broker's 1 MiB limit", kind: ErrTooLarge}
	}
	if p.cfg.nonBlocking {
		select {
		case p.slots <- struct{}{}:
		default:
			return nil, &Error{Op: "publish", Topic: p.topic, kind: ErrBufferFull, Message: "the publisher's buffer is full"}
		}
	} else {
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	r := &Pending{done: make(chan struct{}), wire: w, size: size, noDup: pc.noDup}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.slots
		return nil, &Error{Op: "publish", Topic: p.topic, kind: ErrClosed}
	}
	p.outstanding[r] = struct{}{}
	p.in <- r // never blocks: the channel has room for every slot
	p.mu.Unlock()
	return r, nil
}

// Flush sends what is buffered now and waits until every message published before the
// call has its result, or ctx ends. It returns the failures of those messages, joined.
func (p *Publisher) Flush(ctx context.Context) error {
	p.mu.Lock()
	snap := make([]*Pending, 0, len(p.outstanding))
	for r := range p.outstanding {
		snap = append(snap, r)
	}
	p.mu.Unlock()
	select {
	case p.cut <- struct{}{}:
	default:
	}
	var errs []error
	seen := map[error]bool{}
	for _, r := range snap {
		select {
		case <-r.done:
			if r.err != nil && !seen[r.err] {
				seen[r.err] = true
				errs = append(errs, r.err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}

// Close stops accepting messages, sends what is buffered and waits for the results
// within ctx, then stops the Publisher's goroutines. Closing twice is harmless.
func (p *Publisher) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.Flush(ctx)
	if ctx.Err() != nil {
		return err
	}
	p.closeOnce.Do(func() {
		close(p.stop)
		p.wg.Wait()
	})
	return err
}

func (p *Publisher) collect() {
	defer p.wg.Done()
	defer close(p.batches)
	var batch []*Pending
	size := 0
	var linger *time.Timer
	var lingerC <-chan time.Time
	flush := func() {
		if linger != nil {
			linger.Stop()
			linger, lingerC = nil, nil
		}
		if len(batch) == 0 {
			return
		}
		p.batches <- batch
		batch, size = nil, 0
	}
	add := func(r *Pending) {
		if len(batch) > 0 && size+r.size > p.cfg.bytes {
			flush()
		}
		batch = append(batch, r)
		size += r.size
		if len(batch) >= p.cfg.count || size >= p.cfg.bytes {
			flush()
		}
	}
	for {
		select {
		case r := <-p.in:
			add(r)
			if p.cfg.linger == 0 {
				// Take what else is waiting, then send at once.
				for more := true; more; {
					select {
					case r := <-p.in:
						add(r)
					default:
						more = false
					}
				}
				flush()
			} else if len(batch) > 0 && linger == nil {
				linger = time.NewTimer(p.cfg.linger)
				lingerC = linger.C
			}
		case <-lingerC:
			linger, lingerC = nil, nil
			flush()
		case <-p.cut:
			for more := true; more; {
				select {
				case r := <-p.in:
					add(r)
				default:
					more = false
				}
			}
			flush()
		case <-p.stop:
			for more := true; more; {
				select {
				case r := <-p.in:
					add(r)
				default:
					more = false
				}
			}
			flush()
			return
		}
	}
}

func (p *Publisher) send() {
	defer p.wg.Done()
	for batch := range p.batches {
		wire := make([]api.OutgoingMessage, len(batch))
		idx := make([]int, len(batch))
		allowDup := !p.cfg.noDup
		for i, r := range batch {
			wire[i], idx[i] = r.wire, i
			if r.noDup {
				allowDup = false
			}
		}
		res := make([]ProduceResult, len(batch))
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-p.c.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		p.c.produceChunk(ctx, p.topic, wire, idx, res, allowDup)
		if len(batch) > 1 && refusedWhole(res[0].Err) {
			// The broker refused the whole request for one message (a schema
			// violation, a bad payload: 400 or 413, nothing stored). The batch mixes
			// the messages of many callers: resend each alone, so that only the
			// refused one fails and the others are stored (as the Python SDK does).
			for i, r := range batch {
				p.c.produceChunk(ctx, p.topic, wire, []int{i}, res, !p.cfg.noDup && !r.noDup)
			}
		}
		cancel()
		var firstErr error
		p.mu.Lock()
		for i, r := range batch {
			r.produced, r.err = res[i].Produced, res[i].Err
			if r.err != nil && firstErr == nil {
				firstErr = r.err
			}
			delete(p.outstanding, r)
			close(r.done)
			<-p.slots
		}
		p.mu.Unlock()
		p.c.observe(Event{Kind: EventPublish, Op: "produce-batch", Topic: p.topic, Messages: len(batch), Start: start, Duration: time.Since(start), Err: firstErr})
	}
}

// refusedWhole reports whether a batch request was refused as sent, with nothing
// stored: 400 (a message the broker will not take, such as a schema violation) or 413.
func refusedWhole(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.PartlyStored == nil &&
		(e.Status == http.StatusBadRequest || e.Status == http.StatusRequestEntityTooLarge)
}
