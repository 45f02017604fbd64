package netns

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// helperEnv makes the test binary a UDP helper inside a namespace: "echo ADDR" answers
// every packet it gets at ADDR; "probe ADDR N WAIT" sends N packets to ADDR, each
// given WAIT for its echo, and prints how many came back.
const helperEnv = "NETNS_TEST_HELPER"

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		os.Exit(helper(strings.Fields(h)))
	}
	os.Exit(m.Run())
}

func helper(args []string) int {
	switch args[0] {
	case "echo":
		c, err := net.ListenPacket("udp", args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("listening")
		buf := make([]byte, 64)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return 1
			}
			_, _ = c.WriteTo(buf[:n], from)
		}
	case "probe":
		n, _ := strconv.Atoi(args[2])
		wait, _ := time.ParseDuration(args[3])
		c, err := net.Dial("udp", args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		got := 0
		buf := make([]byte, 64)
		for i := range n {
			_, _ = fmt.Fprintf(c, "%d", i)
			_ = c.SetReadDeadline(time.Now().Add(wait))
			if _, err := c.Read(buf); err == nil {
				got++
			}
		}
		fmt.Println(got)
		return 0
	}
	return 2
}

// TestCutsAreMadeInTheKernel: two hosts on the bridge hear each other over UDP; a
// deaf host's rules drop what comes in, a mute host's what goes out, a lossy one some;
// healed, they hear each other again; Close leaves no namespace behind.
func TestCutsAreMadeInTheKernel(t *testing.T) {
	if err := Check(); err != nil {
		t.Skipf("%v: the namespace tier runs as root (make chaos-cluster, CI)", err)
	}
	ctx := context.Background()
	n, err := Setup(ctx, fmt.Sprintf("nvt%d", os.Getpid()%100000), 251, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
		for _, h := range n.Hosts {
			if _, err := os.Stat("/run/netns/" + h.NS); err == nil {
				t.Errorf("namespace %s is left after Close", h.NS)
			}
		}
	}()
	a, _ := n.Host("a")
	b, _ := n.Host("b")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	echo := n.Command(b, self)
	echo.Env = append(os.Environ(), helperEnv+"=echo "+b.IP+":9000")
	out, err := echo.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := echo.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = echo.Process.Kill(); _ = echo.Wait() }()
	line := make([]byte, 16)
	if k, err := out.Read(line); err != nil || !strings.Contains(string(line[:k]), "listening") {
		t.Fatalf("the echo helper did not start: %q %v", line[:k], err)
	}
	// probe sends 20 packets from a to b's echo, each given wait for its echo: long
	// where every packet should come back (a loaded machine may be slow to run the
	// echo), short where none should.
	probeN := func(count int, wait time.Duration) int {
		t.Helper()
		c := n.Command(a, self)
		c.Env = append(os.Environ(), fmt.Sprintf("%s=probe %s:9000 %d %s", helperEnv, b.IP, count, wait))
		got, err := c.Output()
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		k, err := strconv.Atoi(strings.TrimSpace(string(got)))
		if err != nil {
			t.Fatalf("probe printed %q", got)
		}
		return k
	}
	probe := func(wait time.Duration) int { t.Helper(); return probeN(20, wait) }
	// The new links may take a moment to carry packets: wait for a first echo.
	for up := time.Now().Add(30 * time.Second); probeN(1, 500*time.Millisecond) != 1; {
		if time.Now().After(up) {
			t.Fatal("no packet from a to b was echoed within 30 s of the setup")
		}
	}
	const healthy, cut = 2 * time.Second, 50 * time.Millisecond
	if k := probe(healthy); k != 20 {
		t.Fatalf("a healthy network echoed %d of 20 packets", k)
	}
	for _, c := range []struct {
		host Host
		f    Fault
		what string
	}{{b, Fault{{P: 1}}, "b deaf"}, {b, Fault{{Out: true, P: 1}}, "b mute"}, {a, Fault{{P: 1}, {Out: true, P: 1}}, "a cut"}, {b, Fault{{Peer: a.IP, P: 1}}, "b deaf to a"}} {
		if err := n.Apply(ctx, c.host, c.f); err != nil {
			t.Fatal(err)
		}
		if k := probe(cut); k != 0 {
			t.Errorf("%s: %d of 20 packets echoed; want none", c.what, k)
		}
		if err := n.Apply(ctx, c.host, nil); err != nil {
			t.Fatal(err)
		}
		if k := probe(healthy); k != 20 {
			t.Errorf("healed after %s: %d of 20 packets echoed", c.what, k)
		}
	}
	// A partition from another address drops nothing of b's; from b's, everything.
	if err := n.Apply(ctx, a, Fault{{Peer: hostIP(251, 7), P: 1}, {Out: true, Peer: hostIP(251, 7), P: 1}}); err != nil {
		t.Fatal(err)
	}
	if k := probe(healthy); k != 20 {
		t.Errorf("a cut from another address only: %d of 20 packets echoed", k)
	}
	if err := n.Apply(ctx, a, Fault{{Peer: hostIP(251, 7), P: 1}, {Peer: b.IP, P: 1}}); err != nil {
		t.Fatal(err)
	}
	if k := probe(cut); k != 0 {
		t.Errorf("a cut from b: %d of 20 packets echoed; want none", k)
	}
	if err := n.Apply(ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	// Half the packets lost each way: 20 probes all answered has odds of about 1e-5.
	if err := n.Apply(ctx, b, Fault{{P: 0.5}, {Out: true, P: 0.5}}); err != nil {
		t.Fatal(err)
	}
	if k := probe(200 * time.Millisecond); k == 20 {
		t.Error("a lossy host (50 % each way) echoed every packet")
	}
}
