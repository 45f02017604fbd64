package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/quic-go/quic-go"
)

// rawDial opens a bare QUIC connection to a node, as a stranger that knows the
// protocol's name but not necessarily the secret.
func rawDial(t *testing.T, addr string) *quic.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	qc, err := quic.DialAddr(ctx, addr, clientTLSConfig(), &quic.Config{MaxIdleTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	t.Cleanup(func() { qc.CloseWithError(0, "") })
	return qc
}

// sendEveryOperation opens a stream for each operation and one raft stream on qc, as
// an attacker would before (or instead of) finishing the handshake.
func sendEveryOperation(t *testing.T, qc *quic.Conn) []*quic.Stream {
	t.Helper()
	var sts []*quic.Stream
	for _, op := range testOps {
		st, err := qc.OpenStream()
		if err != nil {
			return sts // the connection is already closed: nothing can be served
		}
		_, _ = st.Write(appendFrame(nil, header{version: frameVersion, kind: kindRequest, code: op, timeoutMS: 5000}, []byte("let me in")))
		sts = append(sts, st)
	}
	if st, err := qc.OpenStream(); err == nil {
		_, _ = st.Write(appendFrame(nil, header{version: frameVersion, kind: kindRaftStream}, nil))
		sts = append(sts, st)
	}
	return sts
}

// raftAccepts collects the raft streams a node's layer hands out.
func raftAccepts(n *testNode) <-chan net.Conn {
	ch := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := n.StreamLayer().Accept()
			if err != nil {
				close(ch)
				return
			}
			ch <- c
		}
	}()
	return ch
}

func assertNothingServed(t *testing.T, victim *testNode, raft <-chan net.Conn) {
	t.Helper()
	if got := victim.served.Load(); got != 0 {
		t.Errorf("%d handler runs for an unauthenticated peer, want 0", got)
	}
	if s := victim.Stats(); s.RequestsServed != 0 || s.RaftStreams != 0 {
		t.Errorf("stats after an unauthenticated peer: %+v", s)
	}
	select {
	case c := <-raft:
		if c != nil {
			t.Errorf("the raft layer accepted a stream from an unauthenticated peer")
		}
	default:
	}
}

func TestWrongSecretGetsNoOperationNorRaftStream(t *testing.T) {
	victim := mustStartNode(t, "victim", nil)
	intruder := mustStartNode(t, "intruder", func(o *Options) { o.Secret = secretX })
	raft := raftAccepts(victim)

	for _, op := range testOps {
		err := callWithin(t, intruder, victim.Addr(), op, 10*time.Second, 30*time.Second)
		mustErrIs(t, err, ErrUnauthenticated)
		// Let the backoff pass, so every operation really tries a fresh handshake.
		intruder.mu.Lock()
		delete(intruder.dials, victim.Addr())
		intruder.mu.Unlock()
	}
	_, err := intruder.StreamLayer().Dial(raftAddr(victim), 10*time.Second)
	mustErrIs(t, err, ErrUnauthenticated)
	// The other direction fails too: the victim will not prove itself to a server
	// without the secret, nor accept the intruder's proof of nothing.
	err = callWithin(t, victim, intruder.Addr(), opEcho, 10*time.Second, 30*time.Second)
	mustErrIs(t, err, ErrUnauthenticated)
	if s := victim.Stats(); s.AuthFailures < uint64(len(testOps)+1) || s.Conns != 0 {
		t.Errorf("victim stats %+v: want an auth failure per attempt and no connection", s)
	}
	if s := intruder.Stats(); s.AuthFailures < uint64(len(testOps)+1) || s.Conns != 0 {
		t.Errorf("intruder stats %+v: want an auth failure per attempt and no connection", s)
	}
	assertNothingServed(t, victim, raft)
	if intruder.served.Load() != 0 {
		t.Errorf("the intruder served the victim")
	}
}

func TestRawClientWithoutTheSecretGetsNothingServed(t *testing.T) {
	victim := mustStartNode(t, "victim", func(o *Options) { o.HandshakeTimeout = 2 * time.Second })
	raft := raftAccepts(victim)

	t.Run("operations before the proof", func(t *testing.T) {
		qc := rawDial(t, victim.Addr())
		hs, err := qc.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		nonce, _ := newNonce()
		if _, err := hs.Write(encodeHello(hello{version: handshakeVersion, nonce: nonce, nodeID: "mallory", advertised: "127.0.0.1:1"})); err != nil {
			t.Fatal(err)
		}
		if _, err := readChallenge(hs); err != nil {
			t.Fatalf("reading the challenge: %v", err)
		}
		// Every operation, queued while the handshake waits for the proof...
		sts := sendEveryOperation(t, qc)
		// ...then a proof made without the secret.
		if _, err := hs.Write(make([]byte, macLen)); err != nil {
			t.Fatal(err)
		}
		waitClosedWith(t, qc, connCodeUnauthenticated)
		for _, st := range sts {
			if b, err := io.ReadAll(st); len(b) > 0 || err == nil {
				t.Errorf("a stream opened before the proof got an answer %q (err %v)", b, err)
			}
		}
	})
	t.Run("operations instead of a hello", func(t *testing.T) {
		qc := rawDial(t, victim.Addr())
		sendEveryOperation(t, qc)
		waitClosedWith(t, qc, connCodeHandshake)
	})
	t.Run("silence", func(t *testing.T) {
		// A connection that never speaks is closed once the handshake timeout passed.
		qc := rawDial(t, victim.Addr())
		waitClosedWith(t, qc, connCodeHandshake)
	})
	assertNothingServed(t, victim, raft)
	if s := victim.Stats(); s.AuthFailures < 1 || s.HandshakeErrors < 2 {
		t.Errorf("victim stats %+v: want the failures counted", s)
	}
}

// waitClosedWith waits until the node closed qc with the given application code.
func waitClosedWith(t *testing.T, qc *quic.Conn, code quic.ApplicationErrorCode) {
	t.Helper()
	select {
	case <-qc.Context().Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("the node did not close the connection")
	}
	var ae *quic.ApplicationError
	if err := context.Cause(qc.Context()); !errors.As(err, &ae) || ae.ErrorCode != code || !ae.Remote {
		t.Fatalf("connection closed with %v, want the peer's application code %d", err, code)
	}
}

func TestUnknownHandshakeVersionIsAnsweredCleanly(t *testing.T) {
	victim := mustStartNode(t, "victim", nil)
	qc := rawDial(t, victim.Addr())
	hs, err := qc.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	b := encodeHello(hello{version: handshakeVersion, nodeID: "future"})
	b[4] = 9
	if _, err := hs.Write(b); err != nil {
		t.Fatal(err)
	}
	_, err = readChallenge(hs)
	mustErrIs(t, err, ErrUnsupportedVersion)
	waitClosedWith(t, qc, connCodeVersion)
	// The node is unharmed.
	mustEcho(t, mustStartNode(t, "friend", nil), victim, "still here")
}

func TestPeerWithTheSameNodeIDIsRefused(t *testing.T) {
	a := mustStartNode(t, "twin", nil)
	b := mustStartNode(t, "twin", nil)
	err := callWithin(t, a, b.Addr(), opEcho, 10*time.Second, 30*time.Second)
	mustErrIs(t, err, ErrUnauthenticated)
	if b.served.Load() != 0 {
		t.Errorf("served a peer with the node's own id")
	}
}

func TestHandshakeFloodIsBounded(t *testing.T) {
	const limit = 4 // one per host
	victim := mustStartNode(t, "victim", func(o *Options) {
		o.MaxPendingHandshakes = limit
		o.HandshakeTimeout = 3 * time.Second
	})
	// limit connections, from as many hosts, that finish TLS and then never say hello
	// hold every slot...
	silentFrom := func() []*quic.Conn {
		var silent []*quic.Conn
		for i := range limit {
			silent = append(silent, rawDialFrom(t, fmt.Sprintf("127.0.0.%d", 2+i), victim.Addr()))
		}
		return silent
	}
	silent := silentFrom()
	// ...so one more, from yet another host, is closed at once, without waiting for
	// its handshake timeout.
	for i := 0; ; i++ {
		extra := rawDialFrom(t, "127.0.0.9", victim.Addr())
		<-extra.Context().Done()
		var ae *quic.ApplicationError
		err := context.Cause(extra.Context())
		if errors.As(err, &ae) && ae.ErrorCode == connCodeRefused {
			break
		}
		// The silent ones may have timed out before this one arrived on a slow machine;
		// then the slots were free, which is no failure of the bound. Try again.
		if i > 5 {
			t.Fatalf("extra connection closed with %v, want refused (code %d)", err, connCodeRefused)
		}
		silent = silentFrom()
	}
	if victim.Stats().HandshakesRefused == 0 {
		t.Errorf("the refused handshake was not counted")
	}
	// Once the silent ones timed out, a real node gets in.
	for _, qc := range silent {
		waitClosedWith(t, qc, connCodeHandshake)
	}
	friend := mustStartNode(t, "friend", nil)
	mustEcho(t, friend, victim, "after the flood")
}

func TestExpiredCertificateStillConnects(t *testing.T) {
	notAfter := time.Now().Add(time.Second)
	cert, err := generateCertificate(notAfter)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the certificate to expire", 30*time.Second, func() bool { return time.Now().After(notAfter) })
	leaf, err := parseLeaf(cert)
	if err != nil {
		t.Fatal(err)
	}
	if !time.Now().After(leaf.NotAfter) {
		t.Fatalf("certificate not expired: NotAfter %v", leaf.NotAfter)
	}
	old := mustStartNode(t, "old", func(o *Options) { o.Certificate = &cert })
	other := mustStartNode(t, "other", func(o *Options) { o.Certificate = &cert })
	fresh := mustStartNode(t, "fresh", nil)
	mustEcho(t, fresh, old, "expired server")
	mustEcho(t, old, other, "expired both")
	mustEcho(t, old, fresh, "expired client")
}

func raftAddr(n *testNode) raft.ServerAddress { return raft.ServerAddress(n.Addr()) }
