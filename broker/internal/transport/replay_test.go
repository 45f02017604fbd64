package transport

import (
	"io"
	"testing"

	"github.com/quic-go/quic-go"
)

// manualHandshake runs the client side of the secret handshake by hand on a fresh
// connection to victim, claiming id and addr with nonce. proofFor picks the proof to
// send from the one this connection calls for; the server's verdict (0 ok) is returned,
// or 255 when the server answered none.
func manualHandshake(t *testing.T, victim *testNode, nonce [nonceLen]byte, id, addr string, proofFor func(right [macLen]byte) [macLen]byte) (*quic.Conn, byte) {
	t.Helper()
	qc := rawDial(t, victim.Addr())
	hs, err := qc.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hs.Write(encodeHello(hello{version: handshakeVersion, nonce: nonce, nodeID: id, advertised: addr})); err != nil {
		t.Fatal(err)
	}
	c, err := readChallenge(hs)
	if err != nil {
		t.Fatalf("reading the challenge: %v", err)
	}
	exporter, err := exportKeyingMaterial(qc)
	if err != nil {
		t.Fatal(err)
	}
	right := proof(secretA, macLabelClient, exporter, c.nonce, nonce, handshakeIDs(id, addr, c.nodeID))
	p := proofFor(right)
	if _, err := hs.Write(p[:]); err != nil {
		t.Fatal(err)
	}
	var v [1]byte
	if _, err := io.ReadFull(hs, v[:]); err != nil {
		return qc, 255
	}
	return qc, v[0]
}

// TestRecordedProofIsNotAcceptedAgain: a proof is bound to its TLS session (the
// exporter) and to both nonces, so one recorded from a successful handshake, replayed
// on a new connection with the same hello, is refused; so is a proof made for
// another node id or address than the hello claimed. The proof made for the
// connection itself is accepted (the manual handshake is right).
func TestRecordedProofIsNotAcceptedAgain(t *testing.T) {
	victim := mustStartNode(t, "victim", nil)
	nonce, _ := newNonce()
	var recorded [macLen]byte
	_, v := manualHandshake(t, victim, nonce, "honest", "127.0.0.1:1", func(right [macLen]byte) [macLen]byte {
		recorded = right
		return right
	})
	if v != hsOK {
		t.Fatalf("the right proof was answered %d, want ok", v)
	}

	replay, v := manualHandshake(t, victim, nonce, "honest", "127.0.0.1:1", func([macLen]byte) [macLen]byte { return recorded })
	if v == hsOK {
		t.Fatalf("a proof recorded on another connection was accepted")
	}
	waitClosedWith(t, replay, connCodeUnauthenticated)

	// A proof for another claimed id, sent after a hello naming this one: the ids are
	// in the proof, so neither can be swapped after the fact.
	other, _ := newNonce()
	swapped, v := manualHandshake(t, victim, other, "honest", "127.0.0.1:1", func([macLen]byte) [macLen]byte {
		return proof(secretA, macLabelClient, make([]byte, macLen), other, other, handshakeIDs("someone-else", "127.0.0.1:1", "victim"))
	})
	if v == hsOK {
		t.Fatalf("a proof made for another node id was accepted")
	}
	waitClosedWith(t, swapped, connCodeUnauthenticated)
	if s := victim.Stats(); s.AuthFailures < 2 {
		t.Errorf("victim stats %+v: want both refusals counted as auth failures", s)
	}
}
