//go:build chaosnet

package transport

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ChaosNetEnabled reports whether this binary was built with the chaosnet tag.
const ChaosNetEnabled = true

// chaosWrap wraps the node-plane socket in a chaosConn when ChaosNetEnvVar names a
// rules file; otherwise it returns the socket unchanged.
func chaosWrap(pc net.PacketConn) net.PacketConn {
	path := os.Getenv(ChaosNetEnvVar)
	if path == "" {
		return pc
	}
	c := &chaosConn{PacketConn: pc, path: path, done: make(chan struct{}), rng: rand.New(rand.NewSource(time.Now().UnixNano()))}
	c.rules.Store(&chaosRules{})
	fmt.Fprintf(os.Stderr, "%s on file=%s addr=%s\n", ChaosNetPrefix, path, pc.LocalAddr())
	c.reload()
	go c.poll()
	return c
}

// chaosRule is one line of the rules file.
type chaosRule struct {
	kind   string // drop, delay, dup
	in     bool   // received packets (drop only); otherwise sent ones
	prob   float64
	delay  time.Duration
	jitter time.Duration
	peer   string // "": every peer
}

type chaosRules struct {
	text  string
	rules []chaosRule
}

// parseChaosRules reads a rules file's text (see chaosnet.go for the grammar).
func parseChaosRules(text string) ([]chaosRule, error) {
	var out []chaosRule
	sc := bufio.NewScanner(strings.NewReader(text))
	for line := 1; sc.Scan(); line++ {
		l := sc.Text()
		if i := strings.IndexByte(l, '#'); i >= 0 {
			l = l[:i]
		}
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		bad := func(why string) error { return fmt.Errorf("line %d %q: %s", line, sc.Text(), why) }
		if len(f) < 3 || (f[1] != "in" && f[1] != "out") {
			return nil, bad("want KIND in|out VALUE…")
		}
		r := chaosRule{kind: f[0], in: f[1] == "in"}
		rest := f[3:]
		switch r.kind {
		case "drop", "dup":
			p, err := strconv.ParseFloat(f[2], 64)
			if err != nil || p < 0 || p > 1 {
				return nil, bad("the probability must be a number from 0 to 1")
			}
			r.prob = p
			if r.kind == "dup" && r.in {
				return nil, bad("dup applies to sent packets only (out)")
			}
		case "delay":
			if r.in {
				return nil, bad("delay applies to sent packets only (out): delay the peers' sends instead")
			}
			d, err := time.ParseDuration(f[2])
			if err != nil || d < 0 {
				return nil, bad("the delay must be a Go duration")
			}
			r.delay = d
			if len(rest) > 0 && !strings.Contains(rest[0], ":") {
				j, err := time.ParseDuration(rest[0])
				if err != nil || j < 0 || j > d {
					return nil, bad("the jitter must be a Go duration no longer than the delay")
				}
				r.jitter, rest = j, rest[1:]
			}
		default:
			return nil, bad("unknown kind (drop, delay, dup)")
		}
		switch len(rest) {
		case 0:
		case 1:
			if _, err := net.ResolveUDPAddr("udp", rest[0]); err != nil {
				return nil, bad("the peer must be host:port")
			}
			r.peer = rest[0]
		default:
			return nil, bad("too many fields")
		}
		out = append(out, r)
	}
	return out, nil
}

// chaosConn is a packet socket that drops, delays and duplicates packets as its rules
// file says, read again every ChaosNetPoll.
type chaosConn struct {
	net.PacketConn
	path  string
	rules atomic.Pointer[chaosRules]
	done  chan struct{}
	once  sync.Once

	mu  sync.Mutex
	rng *rand.Rand
}

func (c *chaosConn) chance(p float64) bool {
	if p >= 1 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rng.Float64() < p
}

func (c *chaosConn) jitter(r chaosRule) time.Duration {
	if r.jitter == 0 {
		return r.delay
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return r.delay - r.jitter + time.Duration(c.rng.Int63n(int64(2*r.jitter)+1))
}

func (c *chaosConn) poll() {
	t := time.NewTicker(ChaosNetPoll)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			c.reload()
		}
	}
}

// reload reads the rules file; a missing file means no rules, one that does not parse
// keeps the rules in force.
func (c *chaosConn) reload() {
	b, err := os.ReadFile(c.path)
	if err != nil && !os.IsNotExist(err) {
		return // read again at the next poll
	}
	text := string(bytes.TrimSpace(b))
	if cur := c.rules.Load(); cur.text == text {
		return
	}
	rules, err := parseChaosRules(text)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s rules file %s refused, the previous rules stay: %v\n", ChaosNetPrefix, c.path, err)
		c.rules.Store(&chaosRules{text: text, rules: c.rules.Load().rules})
		return
	}
	c.rules.Store(&chaosRules{text: text, rules: rules})
	fmt.Fprintf(os.Stderr, "%s rules now %q\n", ChaosNetPrefix, strings.ReplaceAll(text, "\n", "; "))
}

func matches(r chaosRule, addr net.Addr) bool {
	return r.peer == "" || addr != nil && addr.String() == r.peer
}

func (c *chaosConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, addr, err := c.PacketConn.ReadFrom(b)
		if err != nil {
			return n, addr, err
		}
		dropped := false
		for _, r := range c.rules.Load().rules {
			if r.in && r.kind == "drop" && matches(r, addr) && c.chance(r.prob) {
				dropped = true
				break
			}
		}
		if !dropped {
			return n, addr, err
		}
	}
}

func (c *chaosConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	var delay time.Duration
	copies := 1
	for _, r := range c.rules.Load().rules {
		if r.in || !matches(r, addr) {
			continue
		}
		switch r.kind {
		case "drop":
			if c.chance(r.prob) {
				return len(b), nil // lost on the way: the sender cannot tell
			}
		case "dup":
			if c.chance(r.prob) {
				copies = 2
			}
		case "delay":
			delay = max(delay, c.jitter(r))
		}
	}
	if delay == 0 {
		n, err := c.PacketConn.WriteTo(b, addr)
		if err == nil && copies == 2 {
			_, _ = c.PacketConn.WriteTo(b, addr) // a duplicate: its loss is like any packet's
		}
		return n, err
	}
	held := append([]byte(nil), b...) // the caller reuses b once WriteTo returns
	time.AfterFunc(delay, func() {
		for range copies {
			_, _ = c.PacketConn.WriteTo(held, addr) // sent late: an error is a lost packet
		}
	})
	return len(b), nil
}

func (c *chaosConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return c.PacketConn.Close()
}

// SetReadBuffer and SetWriteBuffer pass through, so quic-go sizes the socket as usual.
func (c *chaosConn) SetReadBuffer(n int) error {
	if s, ok := c.PacketConn.(interface{ SetReadBuffer(int) error }); ok {
		return s.SetReadBuffer(n)
	}
	return nil
}

func (c *chaosConn) SetWriteBuffer(n int) error {
	if s, ok := c.PacketConn.(interface{ SetWriteBuffer(int) error }); ok {
		return s.SetWriteBuffer(n)
	}
	return nil
}
