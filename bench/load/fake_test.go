package load

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// fake is an in-memory Target. It can misbehave on purpose: drop every dropEvery-th
// message it confirms, or deliver every dupEvery-th consumed message a second time,
// so the tests can show the tracker catches both.
type fake struct {
	name      string
	dropEvery int64
	dupEvery  int64
	delay     time.Duration // per produce request, to keep the fake from filling memory
}

type fakeQueue struct {
	f        *fake
	mu       sync.Mutex
	msgs     [][]byte
	wake     chan struct{} // closed and replaced whenever messages arrive
	produced atomic.Int64
	consumed atomic.Int64
	children []*fakeQueue
	deleted  bool
}

func (f *fake) Name() string {
	if f.name == "" {
		return "fake"
	}
	return f.name
}
func (f *fake) PID() int     { return 0 }
func (f *fake) Close() error { return nil }

func (f *fake) Open(context.Context, int) (Queue, error) {
	return &fakeQueue{f: f, wake: make(chan struct{})}, nil
}

// fakeFanout is a fake that also implements Fanouter: the parent copies each message
// into its children as it is produced, so the lag is always zero.
type fakeFanout struct{ *fake }

func (f fakeFanout) OpenFanout(ctx context.Context, partitions, children int) (Queue, func(context.Context) (int64, int64, error), error) {
	q, _ := f.Open(ctx, partitions)
	parent := q.(*fakeQueue)
	for i := 0; i < children; i++ {
		c, _ := f.Open(ctx, partitions)
		parent.children = append(parent.children, c.(*fakeQueue))
	}
	lag := func(context.Context) (int64, int64, error) {
		var copied int64
		for _, c := range parent.children {
			copied += c.produced.Load()
		}
		return 0, copied, nil
	}
	return parent, lag, nil
}

func (q *fakeQueue) Producer(int) Producer      { return q }
func (q *fakeQueue) Consumer(int, int) Consumer { return q }

func (q *fakeQueue) Delete(context.Context) error {
	q.mu.Lock()
	q.deleted, q.msgs = true, nil
	q.mu.Unlock()
	return nil
}

func (q *fakeQueue) push(payloads ...[]byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range payloads {
		n := q.produced.Add(1)
		if q.f.dropEvery > 0 && n%q.f.dropEvery == 0 {
			continue
		}
		q.msgs = append(q.msgs, append([]byte(nil), p...))
	}
	close(q.wake)
	q.wake = make(chan struct{})
	for _, c := range q.children {
		c.push(payloads...)
	}
}

func (q *fakeQueue) Produce(ctx context.Context, payload []byte) error {
	time.Sleep(q.f.delay)
	q.push(payload)
	return nil
}

func (q *fakeQueue) ProduceBatch(ctx context.Context, payloads [][]byte) error {
	time.Sleep(q.f.delay)
	q.push(payloads...)
	return nil
}

func (q *fakeQueue) Consume(ctx context.Context, max int, wait time.Duration) ([]Delivery, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		q.mu.Lock()
		if n := min(max, len(q.msgs)); n > 0 {
			out := make([]Delivery, n)
			for i := range out {
				out[i].Payload = q.msgs[i]
				if c := q.consumed.Add(1); q.f.dupEvery > 0 && c%q.f.dupEvery == 0 {
					q.msgs = append(q.msgs, q.msgs[i])
				}
			}
			q.msgs = q.msgs[n:]
			q.mu.Unlock()
			return out, nil
		}
		w := q.wake
		q.mu.Unlock()
		select {
		case <-w:
		case <-t.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (q *fakeQueue) Ack(_ context.Context, ds []Delivery) (int, error) { return len(ds), nil }
