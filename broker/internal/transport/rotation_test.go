package transport

import (
	"fmt"
	"testing"
	"time"
)

// TestSecretRotationOneNodeAtATime moves a three-node cluster from secret A to secret
// B the way DESIGN.md prescribes, one node per step, and checks after every step that
// fresh connections between every pair still authenticate.
func TestSecretRotationOneNodeAtATime(t *testing.T) {
	nodes := []*testNode{mustStartNode(t, "n1", nil), mustStartNode(t, "n2", nil), mustStartNode(t, "n3", nil)}
	step := 0
	allPairs := func() {
		t.Helper()
		// Fresh handshakes every time: rotation must hold for new connections, not
		// only for ones made before it began.
		for _, n := range nodes {
			n.closeConns()
		}
		for _, from := range nodes {
			for _, to := range nodes {
				if from != to {
					mustEcho(t, from, to, fmt.Sprintf("step %d", step))
				}
			}
		}
		step++
	}
	allPairs()
	// Phase 1: each node in turn learns B as its next secret.
	for _, n := range nodes {
		if err := n.SetSecrets(secretA, secretB); err != nil {
			t.Fatal(err)
		}
		allPairs()
	}
	// Phase 2: each node in turn keeps only B.
	for _, n := range nodes {
		if err := n.SetSecrets(secretB, nil); err != nil {
			t.Fatal(err)
		}
		allPairs()
	}
	// A is gone: a node that holds only A is now a stranger...
	old := mustStartNode(t, "old", nil)
	err := callWithin(t, old, nodes[0].Addr(), opEcho, 10*time.Second, 30*time.Second)
	mustErrIs(t, err, ErrUnauthenticated)
	// ...and one that holds only B is a member.
	mustEcho(t, mustStartNode(t, "new", func(o *Options) { o.Secret = secretB }), nodes[0], "welcome")
}

// TestRotationSkippingPhaseOneFails shows why phase 1 must finish on every node first:
// a node that drops A while a peer knows only A can no longer reach it.
func TestRotationSkippingPhaseOneFails(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", nil)
	if err := b.SetSecrets(secretB, nil); err != nil {
		t.Fatal(err)
	}
	err := callWithin(t, a, b.Addr(), opEcho, 10*time.Second, 30*time.Second)
	mustErrIs(t, err, ErrUnauthenticated)
}
