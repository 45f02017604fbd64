package raftetcd

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A forwarded call stops waiting on a peer found dead, and on a peer this node never
// heard from that stays unheard for a liveness timeout: a node restarted just before
// the leader it forwarded to was killed used to wait out the whole 5 s call timeout,
// its liveness never having found the leader live (so never dead).
func TestCutWhenSilent(t *testing.T) {
	t.Parallel()
	const liveness = 50 * time.Millisecond
	type run struct {
		cancelled chan struct{}
		down      chan struct{}
		heard     atomic.Bool
		ctx       context.Context
		end       context.CancelFunc
		done      chan struct{}
	}
	start := func(heard bool) *run {
		r := &run{cancelled: make(chan struct{}), down: make(chan struct{}), done: make(chan struct{})}
		r.heard.Store(heard)
		r.ctx, r.end = context.WithCancel(context.Background())
		t.Cleanup(r.end)
		go func() {
			defer close(r.done)
			cutWhenSilent(r.ctx, func() { close(r.cancelled) }, r.down, r.heard.Load, liveness)
		}()
		return r
	}
	cut := func(r *run, within time.Duration) bool {
		select {
		case <-r.cancelled:
			return true
		case <-time.After(within):
			return false
		}
	}
	// Never heard, never answering: cut after the liveness timeout, not before.
	began := time.Now()
	if r := start(false); !cut(r, 10*time.Second) {
		t.Fatal("a call to a peer never heard from was not cut")
	}
	if took := time.Since(began); took < liveness/2 {
		t.Fatalf("a call to a peer never heard from was cut after %s, before the liveness timeout of %s", took, liveness)
	}
	// Heard (found live): only its death cuts the call.
	r := start(true)
	if cut(r, 4*liveness) {
		t.Fatal("a call to a peer heard from was cut while nothing said it died")
	}
	close(r.down)
	if !cut(r, 10*time.Second) {
		t.Fatal("a call to a peer found dead was not cut")
	}
	// Unheard at the start, heard before the timeout: not cut then; cut when it dies.
	// (The watch asks at its start and again at the timeout: the second answers yes.)
	r = &run{cancelled: make(chan struct{}), down: make(chan struct{}), done: make(chan struct{})}
	r.ctx, r.end = context.WithCancel(context.Background())
	t.Cleanup(r.end)
	var asks atomic.Int32
	go func() {
		defer close(r.done)
		cutWhenSilent(r.ctx, func() { close(r.cancelled) }, r.down, func() bool { return asks.Add(1) > 1 }, liveness)
	}()
	if cut(r, 4*liveness) {
		t.Fatal("a call to a peer heard from during the call was cut at the unheard timeout")
	}
	if n := asks.Load(); n != 2 {
		t.Fatalf("the watch asked whether the peer was heard %d times; want at its start and at the timeout", n)
	}
	close(r.down)
	if !cut(r, 10*time.Second) {
		t.Fatal("a call to a peer found dead was not cut")
	}
	// The call ending ends the watch.
	r = start(true)
	r.end()
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch outlived its call")
	}
}
