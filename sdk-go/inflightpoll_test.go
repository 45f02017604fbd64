package narad_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// holdProxy is a TCP proxy on 127.0.0.1 in front of the shared broker. It holds back
// the first answer to a long poll (GET .../consume) until the client has ended its side
// of that connection (a close or a half-close), as if the answer were still on the
// network when the consumer shut down; then it passes the answer on. A client's
// half-close is passed on to the broker unless passHalfClose is false, and the held
// answer is never passed on when neverAnswer is set (a proxy that sits on the poll).
// When release is set, the held answer is also passed on once release is closed, even
// though the client has not ended its side (an answer that was on the network when
// the client gave up, and arrives while its connection is still open).
type holdProxy struct {
	t        *testing.T
	ln       net.Listener
	upstream string

	passHalfClose bool
	neverAnswer   bool
	tls           *tls.Config // when set, the proxy takes TLS from the client
	release       <-chan struct{}

	arrived  chan struct{} // the held answer came from the broker
	polled   chan struct{} // a poll was sent to the broker
	holdOnce sync.Once
	pollOnce sync.Once

	mu     sync.Mutex
	closed bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startHoldProxy(t *testing.T, passHalfClose, neverAnswer bool) *holdProxy {
	return startHoldProxyTLS(t, passHalfClose, neverAnswer, nil)
}

func startHoldProxyTLS(t *testing.T, passHalfClose, neverAnswer bool, cfg *tls.Config) *holdProxy {
	t.Helper()
	return startProxy(t, passHalfClose, neverAnswer, cfg, nil)
}

// startReleaseProxy holds the first poll answer until the client ends its side of
// the connection or release is closed, whichever comes first.
func startReleaseProxy(t *testing.T, release <-chan struct{}) *holdProxy {
	t.Helper()
	return startProxy(t, true, false, nil, release)
}

func startProxy(t *testing.T, passHalfClose, neverAnswer bool, cfg *tls.Config, release <-chan struct{}) *holdProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{t: t, ln: ln, upstream: strings.TrimPrefix(shared.url, "http://"),
		passHalfClose: passHalfClose, neverAnswer: neverAnswer, tls: cfg, release: release,
		arrived: make(chan struct{}), polled: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.stop)
	return p
}

func (p *holdProxy) url() string {
	if p.tls != nil {
		return "https://" + p.ln.Addr().String()
	}
	return "http://" + p.ln.Addr().String()
}

// halfCloser is a connection whose write side can be shut alone.
type halfCloser interface {
	net.Conn
	CloseWrite() error
}

func (p *holdProxy) stop() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *holdProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *holdProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		broker, err := net.Dial("tcp", p.upstream)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client) || !p.track(broker) {
			client.Close()
			broker.Close()
			continue
		}
		var front halfCloser = client.(*net.TCPConn)
		if p.tls != nil {
			front = tls.Server(client, p.tls)
		}
		p.wg.Add(2)
		go p.serve(front, broker.(*net.TCPConn))
	}
}

func (p *holdProxy) serve(client, broker halfCloser) {
	var mu sync.Mutex
	pollSent := false
	clientEnded := make(chan struct{})
	go func() { // client to broker
		defer p.wg.Done()
		defer close(clientEnded)
		buf := make([]byte, 32<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				if bytes.HasPrefix(buf[:n], []byte("GET ")) && bytes.Contains(buf[:n], []byte("/consume")) {
					mu.Lock()
					pollSent = true
					mu.Unlock()
					p.pollOnce.Do(func() { close(p.polled) })
				}
				if _, werr := broker.Write(buf[:n]); werr != nil {
					return
				}
			}
			if errors.Is(err, io.EOF) {
				if p.passHalfClose {
					_ = broker.CloseWrite() // the test reads the outcome on the other side
				}
				return
			}
			if err != nil {
				return
			}
		}
	}()
	go func() { // broker to client
		defer p.wg.Done()
		defer client.Close()
		defer broker.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := broker.Read(buf)
			if n > 0 {
				mu.Lock()
				poll := pollSent
				mu.Unlock()
				hold := false
				if poll {
					p.holdOnce.Do(func() { hold = true })
				}
				if hold {
					close(p.arrived)
					select {
					case <-clientEnded:
					case <-p.release:
					case <-time.After(30 * time.Second):
						p.t.Error("proxy: the client never ended its side of the poll's connection")
					}
					if p.neverAnswer {
						return
					}
				}
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				_ = client.CloseWrite()
				<-clientEnded
				return
			}
		}
	}()
}

// TestConsumerHandsBackAnAnswerInFlightAtShutdown: a consumer shuts down while the
// answer of its poll, which leased a message, is on its way (sent by the broker, its
// headers not yet at the client). The answer is read and the message handed back, so
// another consumer gets it at once rather than after the 60 s visibility timeout.
func TestConsumerHandsBackAnAnswerInFlightAtShutdown(t *testing.T) {
	plain := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, plain, narad.TopicConfig{Partitions: 1, VisibilityTimeout: time.Minute})
	if _, err := plain.Produce(ctx, topic, "in flight"); err != nil {
		t.Fatal(err)
	}
	p := startHoldProxy(t, true, false)
	c := newClientAt(t, []string{p.url()})
	handled := make(chan struct{}, 1)
	cs := c.Consumer(topic, func(context.Context, *narad.Message) error { handled <- struct{}{}; return nil },
		narad.WithWait(5*time.Second))
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cs.Run(runCtx) }()
	select {
	case <-p.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the poll's answer never came from the broker")
	}
	cancel() // the answer, with its lease, is on its way
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	if len(handled) != 0 {
		t.Fatal("the handler ran after shutdown began")
	}
	start := time.Now()
	msgs, err := plain.Receive(ctx, topic, narad.WithWait(10*time.Second))
	if err != nil || len(msgs) != 1 {
		t.Fatalf("receive after shutdown: %d messages in %s, %v; want the message back at once (stats %+v)",
			len(msgs), time.Since(start).Round(time.Millisecond), err, cs.Stats())
	}
	if s := cs.Stats(); s.Received != 1 || s.Nacked != 1 {
		t.Fatalf("stats %+v: want the message received and handed back", s)
	}
	if err := msgs[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestConsumerShutdownEndsAnIdlePollAtOnce: the half-close that ends a waiting poll at
// shutdown is answered by the broker at once, so an idle consumer stops well before
// its poll's wait, and before the answer grace a broker that ignored it would take.
func TestConsumerShutdownEndsAnIdlePollAtOnce(t *testing.T) {
	plain := newClient(t)
	topic := mustTopic(t, plain, narad.TopicConfig{Partitions: 1, VisibilityTimeout: time.Minute})
	p := startHoldProxy(t, true, false)
	c := newClientAt(t, []string{p.url()})
	cs := c.Consumer(topic, func(context.Context, *narad.Message) error { return nil }, narad.WithWait(20*time.Second))
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cs.Run(runCtx) }()
	select {
	case <-p.polled:
	case <-time.After(30 * time.Second):
		t.Fatal("no poll was sent")
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(4 * time.Second): // the answer grace is 5 s
		t.Fatal("Run did not return soon after the shutdown of an idle consumer")
	}
	t.Logf("Run returned %s after the shutdown", time.Since(start).Round(time.Millisecond))
	if s := cs.Stats(); s.Received != 0 || s.Errors != 0 {
		t.Fatalf("stats %+v: an idle poll ended by shutdown is no error and leases nothing", s)
	}
}

// TestConsumerShutdownIsBoundedWhenTheCutPollIsNotAnswered: a proxy that neither passes
// the half-close on nor answers holds the poll; the shutdown still ends within the
// answer grace (5 s), not the poll's 20 s wait.
func TestConsumerShutdownIsBoundedWhenTheCutPollIsNotAnswered(t *testing.T) {
	plain := newClient(t)
	topic := mustTopic(t, plain, narad.TopicConfig{Partitions: 1, VisibilityTimeout: time.Minute})
	p := startHoldProxy(t, false, true)
	c := newClientAt(t, []string{p.url()})
	cs := c.Consumer(topic, func(context.Context, *narad.Message) error { return nil }, narad.WithWait(20*time.Second))
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cs.Run(runCtx) }()
	select {
	case <-p.polled:
	case <-time.After(30 * time.Second):
		t.Fatal("no poll was sent")
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run hung on a poll whose cut was not answered")
	}
	if d := time.Since(start); d < 4*time.Second {
		t.Fatalf("Run returned %s after the shutdown: it did not wait for the answer of the cut poll", d)
	}
}

// TestConsumerHandsBackAnAnswerInFlightAtShutdownOverTLS: as
// TestConsumerHandsBackAnAnswerInFlightAtShutdown, over HTTPS (through a proxy that
// ends TLS in front of the broker): the half-close is a TLS close_notify, after which
// the answer is still read.
func TestConsumerHandsBackAnAnswerInFlightAtShutdownOverTLS(t *testing.T) {
	serverCfg, roots := selfSignedTLS(t)
	plain := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, plain, narad.TopicConfig{Partitions: 1, VisibilityTimeout: time.Minute})
	if _, err := plain.Produce(ctx, topic, "in flight"); err != nil {
		t.Fatal(err)
	}
	p := startHoldProxyTLS(t, true, false, serverCfg)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	c := newClientAt(t, []string{p.url()}, narad.WithHTTPClient(hc))
	t.Cleanup(hc.CloseIdleConnections)
	handled := make(chan struct{}, 1)
	cs := c.Consumer(topic, func(context.Context, *narad.Message) error { handled <- struct{}{}; return nil },
		narad.WithWait(5*time.Second))
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cs.Run(runCtx) }()
	select {
	case <-p.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the poll's answer never came from the broker")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	if len(handled) != 0 {
		t.Fatal("the handler ran after shutdown began")
	}
	msgs, err := plain.Receive(ctx, topic, narad.WithWait(10*time.Second))
	if err != nil || len(msgs) != 1 {
		t.Fatalf("receive after shutdown: %d messages, %v; want the message back at once (stats %+v)", len(msgs), err, cs.Stats())
	}
	if s := cs.Stats(); s.Received != 1 || s.Nacked != 1 {
		t.Fatalf("stats %+v: want the message received and handed back", s)
	}
	if err := msgs[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// selfSignedTLS returns a server config with a fresh certificate for 127.0.0.1 and the
// pool that trusts it.
func selfSignedTLS(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "narad-sdk-go-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}}}, roots
}
