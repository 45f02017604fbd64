package transport

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// rawDialFrom opens a bare QUIC connection to addr from a socket bound to host, as a
// stranger on another machine would (any 127.x.y.z address is the loopback on Linux).
func rawDialFrom(t *testing.T, host, addr string) *quic.Conn {
	t.Helper()
	uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(host)})
	if err != nil {
		t.Fatalf("binding %s: %v", host, err)
	}
	t.Cleanup(func() { uc.Close() })
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr := &quic.Transport{Conn: uc}
	t.Cleanup(func() { tr.Close() })
	qc, err := tr.Dial(ctx, ua, clientTLSConfig(), &quic.Config{MaxIdleTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("dialing %s from %s: %v", addr, host, err)
	}
	t.Cleanup(func() { qc.CloseWithError(0, "") })
	return qc
}

// TestHandshakeFloodFromOneHostLeavesRoomForOthers: connections that finish TLS and
// then say nothing hold a pending-handshake slot each until their handshake timeout.
// One host sending them as fast as they time out must not hold every slot: a node
// connecting from another host meanwhile (a restarted member) must get in.
func TestHandshakeFloodFromOneHostLeavesRoomForOthers(t *testing.T) {
	const limit = 8
	victim := mustStartNode(t, "victim", func(o *Options) {
		o.MaxPendingHandshakes = limit
		o.HandshakeTimeout = 20 * time.Second
	})
	// The flood comes from 127.0.0.2; the victim and its friend are on 127.0.0.1.
	for range limit {
		rawDialFrom(t, "127.0.0.2", victim.Addr())
	}
	friend := mustStartNode(t, "friend", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := friend.Call(ctx, victim.Addr(), opEcho, []byte("during the flood")); err != nil {
		t.Fatalf("a node from another host while one host floods the handshakes: %v", err)
	}
	if victim.Stats().HandshakesRefused == 0 {
		t.Errorf("the flood's connections past its host's share were not refused")
	}
}

// TestRemoteHostGroupsAnIPv6Slash64: the share per host counts an IPv6 /64 as one
// host, or a host holding a /64 would get a share per address.
func TestRemoteHostGroupsAnIPv6Slash64(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"127.0.0.2:7950", "127.0.0.2"},
		{"[::ffff:10.0.0.1]:7950", "10.0.0.1"},
		{"[2001:db8:1:2:aaaa::1]:7950", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:bbbb::9]:1", "2001:db8:1:2::/64"},
		{"[2001:db8:1:3::1]:7950", "2001:db8:1:3::/64"},
	} {
		ua, err := net.ResolveUDPAddr("udp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := remoteHost(ua); got != tc.want {
			t.Errorf("remoteHost(%s) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}
