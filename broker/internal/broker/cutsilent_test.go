package broker

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
	// Never heard, never answering: cut after about the liveness timeout.
	if r := start(false); !cut(r, 10*time.Second) {
		t.Fatal("a call to a peer never heard from was not cut")
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
	r = start(false)
	r.heard.Store(true)
	if cut(r, 4*liveness) {
		t.Fatal("a call to a peer heard from during the call was cut at the unheard timeout")
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
