// Command driver-go is the conformance driver of the Go SDK: it reads DRIVER.md
// commands as JSON Lines on stdin, runs them through github.com/narad-mq/narad/sdk-go's
// public API, and writes responses and events as JSON Lines on stdout.
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

var capabilities = []string{
	"produce", "produce_batch", "publisher", "publisher.nonblocking", "receive", "ack", "nack", "extend",
	"consume", "consume.panic", "consume.dead_letter", "replay", "replay.time", "replay.saved", "topics", "children", "close",
}

type request struct {
	ID   int             `json:"id"`
	Cmd  string          `json:"cmd"`
	Args json.RawMessage `json:"args"`
}

type body struct {
	B64  *string         `json:"b64"`
	Text *string         `json:"text"`
	JSON json.RawMessage `json:"json"`
}

func (b body) value() (any, error) {
	switch {
	case b.B64 != nil:
		return base64.StdEncoding.DecodeString(*b.B64)
	case b.Text != nil:
		return *b.Text, nil
	case b.JSON != nil:
		return json.RawMessage(b.JSON), nil
	}
	return nil, errors.New("a body is {b64}, {text} or {json}")
}

type clientState struct {
	c        *narad.Client
	allowDup bool
}

type consumerState struct {
	name   string
	topic  string
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

type publisherState struct {
	p    *narad.Publisher
	name string
	n    int
}

type driver struct {
	wmu sync.Mutex
	out *bufio.Writer

	mu        sync.Mutex
	clients   map[string]*clientState
	msgs      map[string]*narad.Message
	nextMsg   int
	consumers map[string]*consumerState
	byTopic   map[string]*consumerState // client/topic → consumer, for observer events
	pubs      map[string]*publisherState
}

func main() {
	d := &driver{out: bufio.NewWriter(os.Stdout), clients: map[string]*clientState{}, msgs: map[string]*narad.Message{},
		consumers: map[string]*consumerState{}, byTopic: map[string]*consumerState{}, pubs: map[string]*publisherState{}}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	var wg sync.WaitGroup
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			fmt.Fprintln(os.Stderr, "driver-go: bad line:", err)
			continue
		}
		if req.Cmd == "exit" {
			d.reply(req.ID, map[string]any{}, nil)
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := d.handle(req)
			d.reply(req.ID, res, err)
		}()
	}
	// Let commands in flight answer for a moment, then go: the runner is done with us.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	os.Exit(0)
}

func (d *driver) write(v any) {
	line, err := json.Marshal(v)
	if err != nil {
		line, _ = json.Marshal(map[string]any{"event": "error", "data": map[string]any{"error": map[string]any{"kind": "Other", "message": err.Error()}}})
	}
	d.wmu.Lock()
	_, _ = d.out.Write(line) // stdout is the runner's pipe: if it is gone, the run is over
	_ = d.out.WriteByte('\n')
	_ = d.out.Flush()
	d.wmu.Unlock()
}

func (d *driver) reply(id int, res any, err error) {
	if err != nil {
		d.write(map[string]any{"id": id, "ok": false, "error": normErr(err)})
		return
	}
	if res == nil {
		res = map[string]any{}
	}
	d.write(map[string]any{"id": id, "ok": true, "result": res})
}

func (d *driver) event(name string, data map[string]any) {
	d.write(map[string]any{"event": name, "data": data})
}

var kinds = []struct {
	err  error
	kind string
}{
	{narad.ErrBadRequest, "BadRequest"}, {narad.ErrUnauthenticated, "Unauthenticated"}, {narad.ErrForbidden, "Forbidden"},
	{narad.ErrNotFound, "NotFound"}, {narad.ErrConflict, "Conflict"}, {narad.ErrTooLarge, "TooLarge"},
	{narad.ErrLeaseLost, "LeaseLost"}, {narad.ErrThrottled, "Throttled"}, {narad.ErrTimeout, "Timeout"},
	{narad.ErrBufferFull, "BufferFull"}, {narad.ErrUnavailable, "Unavailable"}, {narad.ErrClosed, "Closed"},
	{narad.ErrNotImplemented, "NotImplemented"}, {narad.ErrNoLease, "NoLease"}, {narad.ErrInternal, "Internal"},
}

// normErr maps an SDK error to DRIVER.md's normalised error.
func normErr(err error) map[string]any {
	kind := "Other"
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			kind = k.kind
			break
		}
	}
	out := map[string]any{"kind": kind, "message": err.Error(), "retryable": narad.Retryable(err), "uncertain": narad.Uncertain(err),
		"code": nil, "status": nil}
	var e *narad.Error
	if errors.As(err, &e) {
		if e.Code != "" {
			out["code"] = e.Code
		}
		if e.Status != 0 {
			out["status"] = e.Status
		}
		if e.RetryAfter > 0 {
			out["retry_after_ms"] = e.RetryAfter.Milliseconds()
		}
	}
	return out
}

func (d *driver) client(name string) (*clientState, error) {
	if name == "" {
		name = "default"
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.clients[name]
	if c == nil {
		return nil, fmt.Errorf("no client %q", name)
	}
	return c, nil
}

func (d *driver) msgView(m *narad.Message, keep bool) map[string]any {
	v := map[string]any{"topic": m.Topic, "partition": m.Partition, "offset": m.Offset, "body_b64": base64.StdEncoding.EncodeToString(m.Bytes()),
		"key": nil, "delivery_attempt": nil, "has_lease": m.ReceiptHandle != "", "receipt_handle": nil}
	if m.ReceiptHandle != "" {
		v["receipt_handle"] = m.ReceiptHandle
	}
	if m.Key != "" {
		v["key"] = m.Key
	}
	if m.DeliveryAttempt > 0 {
		v["delivery_attempt"] = m.DeliveryAttempt
	}
	if keep {
		d.mu.Lock()
		d.nextMsg++
		id := "m" + strconv.Itoa(d.nextMsg)
		d.msgs[id] = m
		d.mu.Unlock()
		v["id"] = id
	}
	return v
}

func (d *driver) message(id string) (*narad.Message, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.msgs[id]
	if m == nil {
		return nil, fmt.Errorf("no message %q", id)
	}
	return m, nil
}

func ms(n *int64) time.Duration {
	if n == nil {
		return 0
	}
	return time.Duration(*n) * time.Millisecond
}

func (d *driver) handle(req request) (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var a struct {
		Client    string          `json:"client"`
		Topic     string          `json:"topic"`
		Body      body            `json:"body"`
		Key       *string         `json:"key"`
		Partition *int32          `json:"partition"`
		AllowDup  *bool           `json:"allow_duplicates"`
		Msg       string          `json:"msg"`
		DelayMs   *int64          `json:"delay_ms"`
		LeaseMs   *int64          `json:"lease_ms"`
		Max       int             `json:"max"`
		WaitMs    *int64          `json:"wait_ms"`
		Consumer  string          `json:"consumer"`
		Publisher string          `json:"publisher"`
		Name      string          `json:"name"`
		Raw       json.RawMessage `json:"-"`
	}
	_ = json.Unmarshal(req.Args, &a)
	if a.Consumer == "" {
		a.Consumer = "c"
	}
	if a.Publisher == "" {
		a.Publisher = "p"
	}
	switch req.Cmd {
	case "hello":
		version := "dev"
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, dep := range bi.Deps {
				if dep.Path == "github.com/narad-mq/narad/sdk-go" && dep.Version != "" {
					version = dep.Version
				}
			}
		}
		return map[string]any{"name": "narad-go", "version": version, "language": "go", "capabilities": capabilities}, nil
	case "client.new":
		return d.newClient(req.Args)
	case "close":
		c, err := d.client(a.Client)
		if err != nil {
			return nil, err
		}
		return nil, c.c.Close()
	case "produce":
		c, err := d.client(a.Client)
		if err != nil {
			return nil, err
		}
		b, err := a.Body.value()
		if err != nil {
			return nil, err
		}
		var opts []narad.ProduceOption
		if a.Key != nil {
			opts = append(opts, narad.WithKey(*a.Key))
		}
		if a.Partition != nil {
			opts = append(opts, narad.WithPartition(*a.Partition))
		}
		if (a.AllowDup != nil && !*a.AllowDup) || (a.AllowDup == nil && !c.allowDup) {
			opts = append(opts, narad.NoDuplicates())
		}
		p, err := c.c.Produce(ctx, a.Topic, b, opts...)
		if err != nil {
			return nil, err
		}
		return map[string]any{"topic": p.Topic, "partition": p.Partition, "offset": p.Offset}, nil
	case "produce_batch":
		return d.produceBatch(ctx, req.Args)
	case "publisher.new":
		return d.newPublisher(req.Args)
	case "publisher.publish":
		d.mu.Lock()
		ps := d.pubs[a.Publisher]
		d.mu.Unlock()
		if ps == nil {
			return nil, fmt.Errorf("no publisher %q", a.Publisher)
		}
		b, err := a.Body.value()
		if err != nil {
			return nil, err
		}
		var opts []narad.ProduceOption
		if a.Key != nil {
			opts = append(opts, narad.WithKey(*a.Key))
		}
		pend, err := ps.p.Publish(ctx, b, opts...)
		if err != nil {
			return nil, err
		}
		d.mu.Lock()
		ps.n++
		ticket := fmt.Sprintf("%s-%d", ps.name, ps.n)
		d.mu.Unlock()
		go func() {
			<-pend.Done()
			p, err := pend.Result()
			data := map[string]any{"publisher": ps.name, "ticket": ticket, "ok": err == nil}
			if err != nil {
				data["error"] = normErr(err)
			} else {
				data["partition"], data["offset"] = p.Partition, p.Offset
			}
			d.event("published", data)
		}()
		return map[string]any{"ticket": ticket}, nil
	case "publisher.flush", "publisher.close":
		d.mu.Lock()
		ps := d.pubs[a.Publisher]
		d.mu.Unlock()
		if ps == nil {
			return nil, fmt.Errorf("no publisher %q", a.Publisher)
		}
		var err error
		if req.Cmd == "publisher.flush" {
			err = ps.p.Flush(ctx)
		} else {
			err = ps.p.Close(ctx)
		}
		// Per-message outcomes come as published events; flush itself succeeds once
		// every result is known.
		if err != nil && ctx.Err() != nil {
			return nil, err
		}
		return map[string]any{}, nil
	case "receive":
		c, err := d.client(a.Client)
		if err != nil {
			return nil, err
		}
		opts := []narad.ConsumeOption{narad.WithMaxMessages(max(a.Max, 1))}
		if a.WaitMs != nil {
			opts = append(opts, narad.WithWait(ms(a.WaitMs)))
		}
		msgs, err := c.c.Receive(ctx, a.Topic, opts...)
		if err != nil {
			return nil, err
		}
		views := []any{}
		for _, m := range msgs {
			views = append(views, d.msgView(m, true))
		}
		return map[string]any{"messages": views}, nil
	case "ack", "nack", "extend":
		m, err := d.message(a.Msg)
		if err != nil {
			return nil, err
		}
		switch req.Cmd {
		case "ack":
			err = m.Ack(ctx)
		case "nack":
			err = m.Nack(ctx, ms(a.DelayMs))
		default:
			err = m.Extend(ctx, ms(a.LeaseMs))
		}
		return nil, err
	case "consume.start":
		return d.startConsumer(req.Args)
	case "consume.stop":
		d.mu.Lock()
		cs := d.consumers[a.Consumer]
		d.mu.Unlock()
		if cs == nil {
			return nil, fmt.Errorf("no consumer %q", a.Consumer)
		}
		cs.cancel()
		<-cs.done
		out := map[string]any{"error": nil}
		if cs.err != nil {
			out["error"] = normErr(cs.err)
		}
		return out, nil
	case "replay":
		return d.replay(ctx, req.Args)
	case "topic.create", "topic.get", "topic.delete", "topic.attach_child", "topic.children":
		return d.topics(ctx, req.Cmd, req.Args)
	}
	return nil, &unsupported{req.Cmd}
}

type unsupported struct{ cmd string }

func (u *unsupported) Error() string { return "unsupported command " + u.cmd }

func (d *driver) newClient(raw json.RawMessage) (any, error) {
	var a struct {
		Client    string   `json:"client"`
		Endpoints []string `json:"endpoints"`
		Auth      *struct {
			Username string `json:"username"`
			Password string `json:"password"`
		} `json:"auth"`
		Attempts     int    `json:"attempts"`
		MinBackoffMs *int64 `json:"min_backoff_ms"`
		MaxBackoffMs *int64 `json:"max_backoff_ms"`
		TimeoutMs    *int64 `json:"timeout_ms"`
		AllowDup     *bool  `json:"allow_duplicates"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, err
	}
	if a.Client == "" {
		a.Client = "default"
	}
	name := a.Client
	opts := []narad.Option{narad.WithObserver(func(e narad.Event) { d.observe(name, e) })}
	if a.Auth != nil {
		opts = append(opts, narad.WithBasicAuth(a.Auth.Username, a.Auth.Password))
	}
	if a.Attempts > 0 || a.MinBackoffMs != nil || a.MaxBackoffMs != nil {
		p := narad.DefaultRetry()
		if a.Attempts > 0 {
			p.Attempts = a.Attempts
		}
		lo, hi := narad.DefaultMinBackoff, narad.DefaultMaxBackoff
		if a.MinBackoffMs != nil {
			lo = ms(a.MinBackoffMs)
		}
		if a.MaxBackoffMs != nil {
			hi = ms(a.MaxBackoffMs)
		}
		p.Backoff = func() narad.Backoff { return narad.NewFullJitter(lo, hi) }
		opts = append(opts, narad.WithRetry(p))
	}
	if a.TimeoutMs != nil {
		opts = append(opts, narad.WithRequestTimeout(ms(a.TimeoutMs)))
	}
	c, err := narad.New(a.Endpoints, opts...)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.clients[name] = &clientState{c: c, allowDup: a.AllowDup == nil || *a.AllowDup}
	d.mu.Unlock()
	return map[string]any{}, nil
}

// observe turns the SDK's observer events into DRIVER.md events of the consumer of
// that client and topic.
func (d *driver) observe(client string, e narad.Event) {
	if e.Kind != narad.EventSettle && e.Kind != narad.EventConsumerError {
		return
	}
	d.mu.Lock()
	cs := d.byTopic[client+"\x00"+e.Topic]
	d.mu.Unlock()
	if cs == nil {
		return
	}
	switch e.Kind {
	case narad.EventSettle:
		data := map[string]any{"consumer": cs.name}
		if e.Message != nil {
			data["message"] = map[string]any{"topic": e.Message.Topic, "partition": e.Message.Partition, "offset": e.Message.Offset,
				"delivery_attempt": e.Message.DeliveryAttempt}
			data["partition"], data["offset"] = e.Message.Partition, e.Message.Offset
		}
		outcome := map[string]string{"ack": "acked", "nack": "nacked", "lost": "lost", "failed": "failed"}[e.Outcome]
		data["outcome"] = outcome
		if e.Err != nil {
			data["error"] = normErr(e.Err)
		}
		d.event("settled", data)
		if outcome == "lost" {
			d.event("lease_lost", data)
		}
	case narad.EventConsumerError:
		d.event("error", map[string]any{"consumer": cs.name, "error": normErr(e.Err), "terminal": e.Terminal})
	}
}

func (d *driver) produceBatch(ctx context.Context, raw json.RawMessage) (any, error) {
	var a struct {
		Client   string `json:"client"`
		Topic    string `json:"topic"`
		AllowDup *bool  `json:"allow_duplicates"`
		Messages []struct {
			Body      body   `json:"body"`
			Key       string `json:"key"`
			Partition *int32 `json:"partition"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, err
	}
	c, err := d.client(a.Client)
	if err != nil {
		return nil, err
	}
	var msgs []narad.Outgoing
	for _, m := range a.Messages {
		b, err := m.Body.value()
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, narad.Outgoing{Body: b, Key: m.Key, Partition: m.Partition})
	}
	var opts []narad.ProduceOption
	if (a.AllowDup != nil && !*a.AllowDup) || (a.AllowDup == nil && !c.allowDup) {
		opts = append(opts, narad.NoDuplicates())
	}
	res, _ := c.c.ProduceBatch(ctx, a.Topic, msgs, opts...)
	out := []any{}
	for _, r := range res {
		if r.Err != nil {
			out = append(out, map[string]any{"ok": false, "error": normErr(r.Err)})
		} else {
			out = append(out, map[string]any{"ok": true, "partition": r.Partition, "offset": r.Offset})
		}
	}
	return map[string]any{"results": out}, nil
}

func (d *driver) newPublisher(raw json.RawMessage) (any, error) {
	var a struct {
		Client      string `json:"client"`
		Publisher   string `json:"publisher"`
		Topic       string `json:"topic"`
		LingerMs    *int64 `json:"linger_ms"`
		MaxBatch    int    `json:"max_batch"`
		MaxBuffered int    `json:"max_buffered"`
		Block       *bool  `json:"block"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, err
	}
	if a.Publisher == "" {
		a.Publisher = "p"
	}
	c, err := d.client(a.Client)
	if err != nil {
		return nil, err
	}
	var opts []narad.PublisherOption
	if a.LingerMs != nil {
		opts = append(opts, narad.WithLinger(ms(a.LingerMs)))
	}
	if a.MaxBatch > 0 {
		opts = append(opts, narad.WithBatchCount(a.MaxBatch))
	}
	if a.MaxBuffered > 0 {
		opts = append(opts, narad.WithBufferSize(a.MaxBuffered))
	}
	if a.Block != nil && !*a.Block {
		opts = append(opts, narad.WithNonBlocking())
	}
	p := c.c.Publisher(a.Topic, opts...)
	d.mu.Lock()
	d.pubs[a.Publisher] = &publisherState{p: p, name: a.Publisher}
	d.mu.Unlock()
	return map[string]any{}, nil
}

type scriptRule struct {
	BodyText *string `json:"body_text"`
	Attempt  *int    `json:"attempt"`
	action
}

type action struct {
	Do           string `json:"do"`
	Ms           int64  `json:"ms"`
	Then         string `json:"then"`
	IgnoreCancel bool   `json:"ignore_cancel"`
}

type script struct {
	Rules   []scriptRule `json:"rules"`
	Default *action      `json:"default"`
}

func (s script) pick(m *narad.Message) action {
	for _, r := range s.Rules {
		if r.BodyText != nil && *r.BodyText != string(m.Bytes()) {
			continue
		}
		if r.Attempt != nil && *r.Attempt != m.DeliveryAttempt {
			continue
		}
		return r.action
	}
	if s.Default != nil {
		return *s.Default
	}
	return action{Do: "ok"}
}

func (d *driver) startConsumer(raw json.RawMessage) (any, error) {
	var a struct {
		Client      string `json:"client"`
		Consumer    string `json:"consumer"`
		Topic       string `json:"topic"`
		Concurrency int    `json:"concurrency"`
		WaitMs      *int64 `json:"wait_ms"`
		NackDelayMs *int64 `json:"nack_delay_ms"`
		MaxLeaseMs  *int64 `json:"max_lease_ms"`
		GraceMs     *int64 `json:"grace_ms"`
		Renew       *bool  `json:"renew"`
		Script      script `json:"script"`
		// MaxDeliveries and DeadLetterTopic: capability consume.dead_letter.
		MaxDeliveries   int    `json:"max_deliveries"`
		DeadLetterTopic string `json:"dead_letter_topic"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, err
	}
	if a.Consumer == "" {
		a.Consumer = "c"
	}
	if a.Client == "" {
		a.Client = "default"
	}
	c, err := d.client(a.Client)
	if err != nil {
		return nil, err
	}
	var opts []narad.ConsumeOption
	if a.Concurrency > 0 {
		opts = append(opts, narad.WithConcurrency(a.Concurrency))
	}
	if a.WaitMs != nil {
		opts = append(opts, narad.WithWait(ms(a.WaitMs)))
	}
	if a.NackDelayMs != nil {
		opts = append(opts, narad.WithNackDelay(ms(a.NackDelayMs)))
	}
	if a.MaxLeaseMs != nil {
		opts = append(opts, narad.WithMaxLease(ms(a.MaxLeaseMs)))
	}
	if a.GraceMs != nil {
		opts = append(opts, narad.WithShutdownGrace(ms(a.GraceMs)))
	}
	if a.Renew != nil && !*a.Renew {
		opts = append(opts, narad.WithoutRenewal())
	}
	if a.MaxDeliveries > 0 {
		opts = append(opts, narad.WithMaxDeliveries(a.MaxDeliveries))
	}
	if a.DeadLetterTopic != "" {
		opts = append(opts, narad.WithDeadLetterTopic(a.DeadLetterTopic))
	}
	name := a.Consumer
	h := func(ctx context.Context, m *narad.Message) error {
		view := d.msgView(m, false)
		d.event("started", map[string]any{"consumer": name, "message": view})
		act := a.Script.pick(m)
		start := time.Now()
		outcome, cancelled := act.Do, false
		report := func() {
			data := map[string]any{"consumer": name, "message": view, "outcome": outcome, "cancelled": cancelled,
				"elapsed_ms": time.Since(start).Milliseconds(), "cancel_reason": nil}
			if cancelled {
				reason := "other"
				switch cause := context.Cause(ctx); {
				case errors.Is(cause, narad.ErrLeaseLost):
					reason = "lease_lost"
				case errors.Is(cause, narad.ErrClosed):
					reason = "shutdown"
				}
				data["cancel_reason"] = reason
			}
			d.event("handled", data)
		}
		switch act.Do {
		case "fail":
			report()
			return errors.New("scripted failure")
		case "panic":
			report()
			panic("scripted panic")
		case "sleep":
			if act.IgnoreCancel {
				time.Sleep(time.Duration(act.Ms) * time.Millisecond)
				cancelled = ctx.Err() != nil
			} else {
				select {
				case <-time.After(time.Duration(act.Ms) * time.Millisecond):
				case <-ctx.Done():
					cancelled = true
				}
			}
			outcome = act.Then
			if outcome == "" {
				outcome = "ok"
			}
			report()
			if outcome == "fail" {
				return errors.New("scripted failure")
			}
			return nil
		default:
			outcome = "ok"
			report()
			return nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cs := &consumerState{name: name, topic: a.Topic, cancel: cancel, done: make(chan struct{})}
	d.mu.Lock()
	d.consumers[name] = cs
	d.byTopic[a.Client+"\x00"+a.Topic] = cs
	d.mu.Unlock()
	cons := c.c.Consumer(a.Topic, h, opts...)
	go func() {
		cs.err = cons.Run(ctx)
		if ctx.Err() == nil {
			data := map[string]any{"consumer": name, "error": nil}
			if cs.err != nil {
				data["error"] = normErr(cs.err)
			}
			d.event("stopped", data)
		}
		close(cs.done)
	}()
	return map[string]any{"started": true}, nil
}

func (d *driver) replay(ctx context.Context, raw json.RawMessage) (any, error) {
	var a struct {
		Client string `json:"client"`
		Topic  string `json:"topic"`
		From   struct {
			Offsets     map[string]int64 `json:"offsets"`
			TimeMs      *int64           `json:"time_ms"`
			Incarnation string           `json:"incarnation"`
		} `json:"from"`
		Saved     *string `json:"saved"`
		Partition *int32  `json:"partition"`
		Limit     int     `json:"limit"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, err
	}
	c, err := d.client(a.Client)
	if err != nil {
		return nil, err
	}
	pos := narad.FromStart()
	if a.From.TimeMs != nil {
		pos = narad.FromTime(time.UnixMilli(*a.From.TimeMs))
	}
	if len(a.From.Offsets) > 0 {
		offs := map[int32]int64{}
		for k, v := range a.From.Offsets {
			p, _ := strconv.Atoi(k)
			offs[int32(p)] = v
		}
		pos.Offsets = offs
	}
	pos.Incarnation = a.From.Incarnation
	if a.Saved != nil {
		// A position some SDK saved: the library reads it, as a service resuming would.
		if err := json.Unmarshal([]byte(*a.Saved), &pos); err != nil {
			return nil, err
		}
	}
	var opts []narad.ReplayOption
	if a.Partition != nil {
		opts = append(opts, narad.OnlyPartitions(*a.Partition))
	}
	resume := pos.Clone()
	msgs := []any{}
	for m, err := range c.c.Replay(ctx, a.Topic, pos, opts...) {
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, d.msgView(m, false))
		resume.Advance(m)
		if a.Limit > 0 && len(msgs) >= a.Limit {
			break
		}
	}
	offsets := map[string]any{}
	for p, o := range resume.Offsets {
		offsets[strconv.Itoa(int(p))] = o
	}
	position := map[string]any{"offsets": offsets}
	if resume.Incarnation != "" {
		position["incarnation"] = resume.Incarnation
	}
	saved, err := json.Marshal(resume)
	if err != nil {
		return nil, err
	}
	return map[string]any{"messages": msgs, "position": position, "saved": string(saved)}, nil
}

func (d *driver) topics(ctx context.Context, cmd string, raw json.RawMessage) (any, error) {
	var a struct {
		Client              string `json:"client"`
		Name                string `json:"name"`
		Partitions          int    `json:"partitions"`
		VisibilityTimeoutMs *int64 `json:"visibility_timeout_ms"`
		RetentionMs         *int64 `json:"retention_ms"`
		Parent              string `json:"parent"`
		FanoutDelayMs       *int64 `json:"fanout_delay_ms"`
		Child               string `json:"child"`
		DelayMs             *int64 `json:"delay_ms"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, err
	}
	c, err := d.client(a.Client)
	if err != nil {
		return nil, err
	}
	topicView := func(t *narad.TopicInfo) map[string]any {
		v := map[string]any{"name": t.Name, "partitions": t.Partitions, "visibility_timeout_ms": t.VisibilityTimeout.Milliseconds(),
			"parent": nil, "fanout_delay_ms": t.FanoutDelay.Milliseconds()}
		if t.Parent != "" {
			v["parent"] = t.Parent
		}
		if t.Stats != nil {
			var stats []any
			for _, s := range t.Stats {
				stats = append(stats, map[string]any{"partition": s.Partition, "next_offset": s.NextOffset, "backlog": s.Backlog, "in_flight": s.InFlight})
			}
			v["partition_stats"] = stats
		}
		return v
	}
	switch cmd {
	case "topic.create":
		cfg := narad.TopicConfig{Partitions: a.Partitions, VisibilityTimeout: ms(a.VisibilityTimeoutMs), Retention: ms(a.RetentionMs),
			Parent: a.Parent, FanoutDelay: ms(a.FanoutDelayMs)}
		t, err := c.c.CreateTopic(ctx, a.Name, cfg)
		if err != nil {
			return nil, err
		}
		return topicView(t), nil
	case "topic.get":
		t, err := c.c.Topic(ctx, a.Name)
		if err != nil {
			return nil, err
		}
		return topicView(t), nil
	case "topic.delete":
		return nil, c.c.DeleteTopic(ctx, a.Name)
	case "topic.attach_child":
		ch, err := c.c.AttachChild(ctx, a.Parent, a.Child, ms(a.DelayMs))
		if err != nil {
			return nil, err
		}
		return map[string]any{"child": ch.Name, "fanout_delay_ms": ch.FanoutDelay.Milliseconds()}, nil
	default:
		list, err := c.c.Children(ctx, a.Parent)
		if err != nil {
			return nil, err
		}
		out := []any{}
		for _, ch := range list {
			out = append(out, map[string]any{"child": ch.Name, "fanout_delay_ms": ch.FanoutDelay.Milliseconds()})
		}
		return map[string]any{"children": out}, nil
	}
}
