package narad

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Handler processes one message for a Consumer. Return nil to have the message acked,
// an error to have it handed back (NackAfter chooses the delay). The context is
// cancelled when the lease is lost (context.Cause is then ErrLeaseLost; the message is
// never acked) or when shutdown's grace period ends. A handler may settle the message
// itself with m.Ack or m.Nack; the Consumer then leaves it alone.
type Handler func(ctx context.Context, m *Message) error

// NackAfter wraps err so that the Consumer hands the message back to be delivered again
// after delay instead of the default nack delay.
func NackAfter(err error, delay time.Duration) error {
	return &nackError{err: err, delay: delay}
}

type nackError struct {
	err   error
	delay time.Duration
}

func (e *nackError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("nack after %s", e.delay)
	}
	return e.err.Error()
}
func (e *nackError) Unwrap() error { return e.err }

// PanicError is a handler panic, recovered by the Consumer; the message is handed back.
type PanicError struct {
	Value any
	Stack []byte
}

// Error says what the handler panicked with.
func (e *PanicError) Error() string { return fmt.Sprintf("narad: handler panicked: %v", e.Value) }

// ConsumerStats counts what a Consumer did since it was made.
type ConsumerStats struct {
	// Received counts messages taken under a lease.
	Received int64
	// Acked and Nacked count confirmed settlements by the Consumer or the handler.
	Acked, Nacked int64
	// Lost counts messages whose lease was lost; they are delivered again.
	Lost int64
	// Failed counts handler errors and panics; Panics only panics.
	Failed, Panics int64
	// Renewals counts successful lease renewals.
	Renewals int64
	// Errors counts failures the loop survived (polls, acks).
	Errors int64
	// DeadLettered counts messages produced to the dead-letter topic (WithMaxDeliveries).
	DeadLettered int64
}

// Consumer is a worker loop over one topic: it polls for as many messages as it has
// free workers, runs the handler on each under a renewed lease, and settles the outcome.
// Make one with Client.Consumer and run it with Run, or use Client.Consume.
type Consumer struct {
	c     *Client
	topic string
	h     Handler
	cfg   consumeConfig

	running    atomic.Bool
	visibility atomic.Int64 // the topic's visibility timeout, ns

	received, acked, nacked, lost, failed, panics, renewals, errs, deadLettered atomic.Int64
}

// Consumer returns a worker loop over topic that runs h on each message. Nothing happens
// until Run.
func (c *Client) Consumer(topic string, h Handler, opts ...ConsumeOption) *Consumer {
	cfg := defaultConsumeConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.concurrency > c.cfg.poolSize && c.cfg.httpClient == nil {
		c.log.Warn("narad: consumer concurrency exceeds the connection pool; raise WithPoolSize", "concurrency", cfg.concurrency, "pool", c.cfg.poolSize)
	}
	return &Consumer{c: c, topic: topic, h: h, cfg: cfg}
}

// Consume runs a Consumer over topic until ctx is cancelled or a terminal error stops
// it (see Consumer.Run).
func (c *Client) Consume(ctx context.Context, topic string, h Handler, opts ...ConsumeOption) error {
	return c.Consumer(topic, h, opts...).Run(ctx)
}

// Stats returns the Consumer's counters.
func (cs *Consumer) Stats() ConsumerStats {
	return ConsumerStats{
		Received: cs.received.Load(), Acked: cs.acked.Load(), Nacked: cs.nacked.Load(), Lost: cs.lost.Load(),
		Failed: cs.failed.Load(), Panics: cs.panics.Load(), Renewals: cs.renewals.Load(), Errors: cs.errs.Load(), DeadLettered: cs.deadLettered.Load(),
	}
}

// Run polls and handles messages until ctx is cancelled, then drains: it stops polling,
// lets running handlers finish within the shutdown grace, settles their outcomes, and
// returns nil. Other failures (503, 500, timeouts, lost connections) are retried with
// backoff and reported through the logger, the observer and WithErrorHandler; Run stops
// early only on a terminal error (401, 403, the topic not found, a request the broker
// refuses as malformed), which it returns. Handlers still running after the grace period
// and a short wait beyond it are given up: their leases are no longer renewed, their
// messages are handed back before Run returns, and Run returns an error saying so;
// what such a handler does later is ignored (it never acks). A Consumer runs once at a
// time.
func (cs *Consumer) Run(ctx context.Context) error {
	if !cs.running.CompareAndSwap(false, true) {
		return errors.New("narad: Consumer.Run called while it is running")
	}
	defer cs.running.Store(false)
	if err := cs.checkConfig(); err != nil {
		return err
	}
	if err := cs.learnVisibility(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	refreshCtx, stopRefresh := context.WithCancel(ctx)
	defer stopRefresh()
	go cs.refreshVisibility(refreshCtx)

	// Handlers outlive ctx by the grace period; hard cancels them after it.
	hard, hardCancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer hardCancel(nil)
	slots := make(chan struct{}, cs.cfg.concurrency)
	var wg sync.WaitGroup
	var active sync.Map // *Message → struct{}
	bo := cs.c.cfg.retry.Backoff()
	var stopErr error
	// The polls go through connections of this run's own, so that shutdown can end the
	// poll in flight by a half-close and still read its answer (pollcut.go). No poll
	// starts after shutdown began, so a half-closed connection is never used again.
	pollVia, pollTr := cs.c.pollClient()
	if pollTr != nil {
		defer pollTr.CloseIdleConnections()
	}

loop:
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		if ctx.Err() != nil {
			break loop // both were ready, and select took the slot
		}
		free := 1
		for free < cs.cfg.concurrency {
			select {
			case slots <- struct{}{}:
				free++
				continue
			default:
			}
			break
		}
		msgs, err := cs.c.poll(ctx, cs.topic, free, cs.cfg.wait, pollVia)
		for i := len(msgs); i < free; i++ {
			<-slots
		}
		if err != nil && len(msgs) == 0 {
			if ctx.Err() != nil {
				break loop
			}
			if terminal(err) {
				stopErr = err
				cs.report(err, true)
				break loop
			}
			cs.report(err, false)
			wait := bo.NextBackOff()
			var e *Error
			if errors.As(err, &e) && retryAfterWait(e.RetryAfter) > wait {
				wait = retryAfterWait(e.RetryAfter)
			}
			if !sleepCtx(ctx, wait) {
				break loop
			}
			continue
		}
		bo.Reset()
		for _, m := range msgs {
			cs.received.Add(1)
			wg.Add(1)
			active.Store(m, struct{}{})
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				defer active.Delete(m)
				if ctx.Err() != nil {
					// Taken while shutting down and never started: hand it back now.
					cs.settle(ctx, m, "nack", 0)
					return
				}
				cs.work(ctx, hard, m)
			}()
		}
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return stopErr
	case <-time.After(cs.cfg.grace):
	}
	hardCancel(fmt.Errorf("narad: shutdown grace of %s is over: %w", cs.cfg.grace, ErrClosed))
	select {
	case <-done:
		return stopErr
	case <-time.After(min(max(cs.cfg.grace/2, time.Second), 10*time.Second)):
	}
	// Give up on the handlers still running: stop renewing their leases and hand their
	// messages back now, so they are delivered again at once rather than held (up to the
	// max lease) by a renewal that outlives Run. Whatever such a handler does later is
	// ignored, and its message is never acked by it.
	var stragglers []*Message
	active.Range(func(k, _ any) bool {
		if m := k.(*Message); m.giveUp() {
			stragglers = append(stragglers, m)
		}
		return true
	})
	var nacks sync.WaitGroup
	for _, m := range stragglers {
		nacks.Add(1)
		go func() {
			defer nacks.Done()
			cs.c.log.Warn("narad: handler outlived the shutdown grace; handing the message back", "topic", cs.topic, "partition", m.Partition, "offset", m.Offset)
			if ok, _, _ := m.state(); !ok {
				cs.settle(ctx, m, "nack", 0)
			}
			m.markLost() // never ack what outlived the drain
		}()
	}
	nacks.Wait()
	if len(stragglers) == 0 {
		return stopErr // the last ones returned just now, and settle their messages
	}
	err := fmt.Errorf("narad: %d handler(s) of topic %s still running after the shutdown grace of %s and a cancel; their messages were handed back and will be delivered again", len(stragglers), cs.topic, cs.cfg.grace)
	cs.report(err, true)
	return errors.Join(stopErr, err)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (cs *Consumer) learnVisibility(ctx context.Context) error {
	bo := cs.c.cfg.retry.Backoff()
	for {
		info, err := cs.c.Topic(ctx, cs.topic)
		if err == nil {
			cs.visibility.Store(int64(info.VisibilityTimeout))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if terminal(err) {
			cs.report(err, true)
			return err
		}
		cs.report(err, false)
		if !sleepCtx(ctx, bo.NextBackOff()) {
			return ctx.Err()
		}
	}
}

// refreshVisibility follows changes of the topic's visibility timeout, so renewals are
// scheduled against the lease length the broker really grants.
func (cs *Consumer) refreshVisibility(ctx context.Context) {
	for sleepCtx(ctx, 30*time.Second) {
		if info, err := cs.c.Topic(ctx, cs.topic); err == nil {
			cs.visibility.Store(int64(info.VisibilityTimeout))
		}
	}
}

func (cs *Consumer) report(err error, terminal bool) {
	if !terminal {
		cs.errs.Add(1)
	}
	if terminal {
		cs.c.log.Error("narad: consumer stopped", "topic", cs.topic, "err", err)
	} else {
		cs.c.log.Warn("narad: consumer error (continuing)", "topic", cs.topic, "err", err)
	}
	cs.c.observe(Event{Kind: EventConsumerError, Topic: cs.topic, Err: err, Terminal: terminal, Start: time.Now()})
	if cs.cfg.onError != nil {
		cs.cfg.onError(err)
	}
}

// work runs the handler on m under a renewed lease and settles the outcome.
func (cs *Consumer) work(ctx, hard context.Context, m *Message) {
	hctx, cancel := context.WithCancelCause(hard)
	defer cancel(nil)
	l := newLease(cs, m, cancel)
	m.mu.Lock()
	m.lease = l
	m.mu.Unlock()
	if cs.cfg.renew {
		go l.run()
	} else {
		close(l.done)
	}
	if cs.cfg.maxDeliveries > 0 && m.DeliveryAttempt > cs.cfg.maxDeliveries {
		cs.deadLetter(ctx, m) // its settlement stops the renewal
		l.stop()
		return
	}
	start := time.Now()
	err := cs.invoke(hctx, m)
	l.stop()
	if !m.finish() {
		// Run gave up on this handler at shutdown and handed its message back.
		cs.c.log.Debug("narad: a handler given up at shutdown returned; its outcome is ignored", "topic", cs.topic, "partition", m.Partition, "offset", m.Offset, "err", err)
		return
	}
	cs.c.observe(Event{Kind: EventProcess, Context: hctx, Topic: cs.topic, Message: m, Start: start, Duration: time.Since(start), Err: err})
	if err != nil {
		cs.failed.Add(1)
		var pe *PanicError
		if errors.As(err, &pe) {
			cs.panics.Add(1)
			cs.c.log.Error("narad: handler panicked; the message is handed back", "topic", cs.topic,
				"partition", m.Partition, "offset", m.Offset, "panic", pe.Value, "stack", string(pe.Stack))
			cs.report(err, false)
		}
	}
	settled, outcome, lost := m.state()
	if err != nil && !lost && !errors.As(err, new(*PanicError)) {
		cs.handlerFailed(m, err)
	}
	switch {
	case lost:
		cs.lost.Add(1)
		cs.c.observe(Event{Kind: EventSettle, Context: ctx, Topic: cs.topic, Message: m, Outcome: "lost", Start: time.Now(), Err: ErrLeaseLost})
		cs.report(&Error{Op: "consume", Topic: cs.topic, Code: CodeLeaseLost, Message: fmt.Sprintf("lease of partition %d offset %d was lost; not acked, it is delivered again", m.Partition, m.Offset), kind: ErrLeaseLost}, false)
	case settled:
		// The handler settled it.
		switch outcome {
		case "ack":
			cs.acked.Add(1)
		case "nack":
			cs.nacked.Add(1)
		}
	case err == nil && hard.Err() != nil:
		// The shutdown grace ended while the handler ran and its context was cancelled:
		// its work may be unfinished, so hand the message back rather than ack it (a
		// duplicate is allowed, a loss is not).
		cs.settle(ctx, m, "nack", 0)
	case err == nil:
		cs.settle(ctx, m, "ack", 0)
	default:
		cs.settle(ctx, m, "nack", cs.nackDelayFor(m, err))
	}
}

// handlerFailed tells the user about an error the handler returned: the message is
// handed back, but without a log line or a callback the cause would be visible only as
// redeliveries.
func (cs *Consumer) handlerFailed(m *Message, err error) {
	cs.c.log.Warn("narad: handler failed; the message is handed back", "topic", cs.topic,
		"partition", m.Partition, "offset", m.Offset, "delivery_attempt", m.DeliveryAttempt, "err", err)
	if cs.cfg.onError != nil {
		cs.cfg.onError(fmt.Errorf("narad: handler failed on %s partition %d offset %d (delivery %d): %w",
			cs.topic, m.Partition, m.Offset, m.DeliveryAttempt, err))
	}
}

func (cs *Consumer) invoke(ctx context.Context, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return cs.h(ctx, m)
}

// settle acks or nacks m for the loop, confirmed, with a deadline that survives the
// consumer's own cancellation (acks are flushed during the drain).
func (cs *Consumer) settle(ctx context.Context, m *Message, op string, delay time.Duration) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(cs.currentVisibility(), 10*time.Second))
	defer cancel()
	start := time.Now()
	var err error
	if op == "ack" {
		err = m.Ack(sctx)
	} else {
		err = m.Nack(sctx, delay)
	}
	switch {
	case err == nil:
		if op == "ack" {
			cs.acked.Add(1)
		} else {
			cs.nacked.Add(1)
		}
		cs.c.observe(Event{Kind: EventSettle, Context: sctx, Topic: cs.topic, Op: op, Message: m, Outcome: op, Start: start, Duration: time.Since(start)})
	case errors.Is(err, ErrLeaseLost):
		cs.lost.Add(1)
		cs.c.observe(Event{Kind: EventSettle, Context: sctx, Topic: cs.topic, Op: op, Message: m, Outcome: "lost", Start: start, Duration: time.Since(start), Err: err})
		cs.report(err, false)
	default:
		cs.c.observe(Event{Kind: EventSettle, Context: sctx, Topic: cs.topic, Op: op, Message: m, Outcome: "failed", Start: start, Duration: time.Since(start), Err: err})
		cs.report(err, false)
	}
}

func (cs *Consumer) currentVisibility() time.Duration {
	v := time.Duration(cs.visibility.Load())
	if v <= 0 {
		v = 30 * time.Second
	}
	return v
}

// lease keeps one message's lease alive while its handler runs: it renews before two
// thirds of the window has passed, up to the consumer's max lease, and cancels the
// handler when the lease is lost.
type lease struct {
	cs            *Consumer
	m             *Message
	cancelHandler context.CancelCauseFunc
	started       time.Time

	mu  sync.Mutex
	end time.Time // conservative estimate of when the broker's lease ends

	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	stopped sync.Once
}

func newLease(cs *Consumer, m *Message, cancelHandler context.CancelCauseFunc) *lease {
	now := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	return &lease{cs: cs, m: m, cancelHandler: cancelHandler, started: now,
		end: now.Add(cs.currentVisibility()), ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

// stop ends renewal and waits until no renewal is in flight. It is safe to call twice.
func (l *lease) stop() {
	l.stopped.Do(l.cancel)
	<-l.done
}

// extended records a renewal made by the handler through Message.Extend.
func (l *lease) extended(at time.Time, d time.Duration) {
	if d <= 0 {
		d = l.cs.currentVisibility()
	}
	l.mu.Lock()
	if e := at.Add(d); e.After(l.end) {
		l.end = e
	}
	l.mu.Unlock()
}

func (l *lease) lose(cause error) {
	l.m.markLost()
	l.cancelHandler(cause)
}

func (l *lease) run() {
	defer close(l.done)
	cs := l.cs
	for {
		l.mu.Lock()
		end := l.end
		l.mu.Unlock()
		window := cs.currentVisibility()
		deadline := l.started.Add(cs.cfg.maxLease)
		if !time.Now().Before(deadline) || !end.Before(deadline.Add(-10*time.Millisecond)) {
			// Max lease reached: let it lapse, and stop the handler when it does.
			if !sleepCtx(l.ctx, time.Until(end)) {
				return
			}
			l.lose(fmt.Errorf("narad: the max lease of %s is over: %w", cs.cfg.maxLease, ErrLeaseLost))
			return
		}
		if !sleepCtx(l.ctx, time.Until(end.Add(-window/3))) {
			return
		}
		ext := min(window, time.Until(deadline))
		if ext < time.Millisecond {
			ext = time.Millisecond
		}
		sent := time.Now()
		rctx, cancel := context.WithDeadline(l.ctx, end)
		_, err := cs.c.ack(rctx, "extend", cs.topic, l.m.ReceiptHandle, extendParam(ext, false), l.m.from)
		cancel()
		if l.ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			cs.renewals.Add(1)
			l.mu.Lock()
			l.end = sent.Add(ext)
			l.mu.Unlock()
		case errors.Is(err, ErrLeaseLost):
			l.lose(ErrLeaseLost)
			return
		case !time.Now().Before(end):
			l.lose(fmt.Errorf("narad: could not renew the lease before it ended (%v): %w", err, ErrLeaseLost))
			return
		default:
			cs.report(err, false)
			if !sleepCtx(l.ctx, min(window/10, time.Second)) {
				return
			}
		}
	}
}
