package transport

import (
	"context"
	"testing"
	"time"
)

// TestCrashedPeerRestartedAtItsAddressIsReachedAgain: b crashes (not a word more leaves
// it, no CONNECTION_CLOSE) and starts again at once at the same address. a's connection
// to b was dialed by a, the node with the smaller id, so it wins over the one the new b
// opens, although the process at its other end is gone. a must reach the new b long
// before its idle timeout would drop the dead connection: the new b answers the dead
// connection's packets with a stateless reset, which a believes only because its
// token is derived from the cluster secret.
func TestCrashedPeerRestartedAtItsAddressIsReachedAgain(t *testing.T) {
	slowIdle := func(o *Options) { o.IdleTimeout = 2 * time.Minute }
	a := mustStartNode(t, "a", slowIdle)
	var dc *dropConn
	b := mustStartNode(t, "b", func(o *Options) { slowIdle(o); withDropConn(&dc)(o) })
	mustEcho(t, a, b, "before the crash")
	addr := b.Addr()

	dc.drop.Store(true) // the crash: nothing more leaves b, its goodbye included
	b.Close()
	b2 := mustStartNode(t, "b", func(o *Options) { slowIdle(o); o.ListenAddr = addr })
	mustEcho(t, b2, a, "restarted")

	start := time.Now()
	waitFor(t, "a to reach the restarted b", 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := a.Call(ctx, addr, opEcho, []byte("again"))
		return err == nil
	})
	t.Logf("a reached the restarted b after %v", time.Since(start).Round(time.Millisecond))
}
