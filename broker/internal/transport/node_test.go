package transport

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestTwoNodesAuthenticateAndCallEachOther(t *testing.T) {
	a := mustStartNode(t, "a", nil)
	b := mustStartNode(t, "b", nil)
	mustEcho(t, a, b, "hi")
	mustEcho(t, b, a, "hello")
	mustEcho(t, a, b, "again")
	// b answered over the connection a opened instead of dialing back: one per pair.
	for _, n := range []*testNode{a, b} {
		if s := n.Stats(); s.Conns != 1 {
			t.Errorf("%s has %d connections, want 1", n.NodeID(), s.Conns)
		}
	}
	if d := a.Stats().Dials + b.Stats().Dials; d != 1 {
		t.Errorf("%d dials for one pair, want 1", d)
	}
}

func TestThreeNodesCallEachOther(t *testing.T) {
	nodes := []*testNode{mustStartNode(t, "n1", nil), mustStartNode(t, "n2", nil), mustStartNode(t, "n3", nil)}
	for round := 0; round < 2; round++ {
		for _, from := range nodes {
			for _, to := range nodes {
				if from != to {
					mustEcho(t, from, to, fmt.Sprintf("round %d", round))
				}
			}
		}
	}
	for _, n := range nodes {
		if s := n.Stats(); s.Conns != 2 {
			t.Errorf("%s has %d connections, want 2 (one per peer)", n.NodeID(), s.Conns)
		}
	}
}

func TestSimultaneousDialsConvergeOnOneConnection(t *testing.T) {
	short := func(o *Options) { o.MaxCallTimeout = time.Second; o.HandshakeTimeout = time.Second }
	a := mustStartNode(t, "a", short)
	b := mustStartNode(t, "b", short)
	errs := make(chan error, 2)
	go func() { _, err := a.Call(t.Context(), b.Addr(), opEcho, []byte("1")); errs <- err }()
	go func() { _, err := b.Call(t.Context(), a.Addr(), opEcho, []byte("2")); errs <- err }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "one connection per side", 30*time.Second, func() bool {
		return a.Stats().Conns == 1 && b.Stats().Conns == 1
	})
	mustEcho(t, a, b, "after")
	mustEcho(t, b, a, "after")
}

func TestSecretsShorterThanMinimumAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name          string
		current, next []byte
	}{
		{"empty", nil, nil},
		{"short current", []byte("fifteen bytes!!"), nil},
		{"short next", secretA, []byte("short")},
	} {
		_, err := New(Options{NodeID: "n", ListenAddr: "127.0.0.1:0", Secret: tc.current, NextSecret: tc.next})
		if !errors.Is(err, ErrSecretTooShort) {
			t.Errorf("%s: got %v, want ErrSecretTooShort", tc.name, err)
		}
	}
	_, err := New(Options{NodeID: "n", ListenAddr: "127.0.0.1:0", Secret: []byte("exactly 16 bytes")})
	if err != nil {
		t.Errorf("a 16-byte secret: %v", err)
	}
}
