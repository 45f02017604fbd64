//go:build chaosnet

package transport

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestChaosNetRulesParse(t *testing.T) {
	good := "# a comment\n\ndrop in 1\ndrop out 0.05 127.0.0.1:7001\ndelay out 200ms 100ms\ndelay out 50ms 127.0.0.1:7002\ndup out 0.1\n"
	rs, err := parseChaosRules(good)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 5 || !rs[0].in || rs[0].prob != 1 || rs[1].peer != "127.0.0.1:7001" || rs[2].delay != 200*time.Millisecond ||
		rs[2].jitter != 100*time.Millisecond || rs[3].peer != "127.0.0.1:7002" || rs[3].jitter != 0 || rs[4].kind != "dup" {
		t.Fatalf("parsed %+v", rs)
	}
	for _, bad := range []string{"drop", "drop sideways 1", "drop in 2", "drop in -0.1", "delay in 1s", "delay out soon", "delay out 1s 2s",
		"dup in 0.5", "cut in 1", "drop in 1 nowhere", "drop in 1 127.0.0.1:1 127.0.0.1:2"} {
		if _, err := parseChaosRules(bad); err == nil {
			t.Errorf("%q parsed; want an error", bad)
		}
	}
}

// chaosNode starts a test node whose node plane obeys rules (an empty file at first).
func chaosNode(t *testing.T, id string) (*testNode, string) {
	t.Helper()
	rules := filepath.Join(t.TempDir(), id+".rules")
	if err := os.WriteFile(rules, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(ChaosNetEnvVar, rules) // read by Start
	return mustStartNode(t, id, nil), rules
}

func setRules(t *testing.T, path, rules string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// answers reports whether a call from → to succeeds within a second.
func answers(from, to *testNode) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := from.Call(ctx, to.Addr(), opEcho, []byte("ping"))
	return err == nil
}

// TestChaosNetCuts: a node's rules file cuts it off both ways, makes it deaf (it sends
// but hears nothing) or mute, cuts it from one peer only, and delays and duplicates what
// it sends; each takes effect while the node runs and heals when the file is emptied.
func TestChaosNetCuts(t *testing.T) {
	a, rulesA := chaosNode(t, "a")
	b, _ := chaosNode(t, "b")
	c, _ := chaosNode(t, "c")
	mustEcho(t, a, b, "before")
	mustEcho(t, b, a, "before")
	for _, tc := range []struct{ name, rules string }{
		{"cut both ways", "drop in 1\ndrop out 1\n"},
		{"deaf", "drop in 1\n"},
		{"mute", "drop out 1\n"},
	} {
		setRules(t, rulesA, tc.rules)
		waitFor(t, tc.name+": a's calls to b fail", 20*time.Second, func() bool { return !answers(a, b) })
		waitFor(t, tc.name+": b's calls to a fail", 20*time.Second, func() bool { return !answers(b, a) })
		setRules(t, rulesA, "")
		waitFor(t, tc.name+" healed: a's calls to b answer", 30*time.Second, func() bool { return answers(a, b) })
		waitFor(t, tc.name+" healed: b's calls to a answer", 30*time.Second, func() bool { return answers(b, a) })
	}

	// Cut from b only: c still answers.
	setRules(t, rulesA, "drop in 1 "+b.Addr()+"\ndrop out 1 "+b.Addr()+"\n")
	waitFor(t, "a cut from b", 20*time.Second, func() bool { return !answers(a, b) })
	if !answers(a, c) || !answers(c, a) {
		t.Fatal("a cut from b only could not reach c")
	}
	setRules(t, rulesA, "")
	waitFor(t, "a and b healed", 30*time.Second, func() bool { return answers(a, b) && answers(b, a) })

	// Every packet a sends held 300 ms: a call from a takes at least that long, and
	// duplicates change nothing QUIC cannot absorb.
	setRules(t, rulesA, "delay out 300ms\ndup out 1\n")
	waitFor(t, "a's sends delayed", 20*time.Second, func() bool {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := a.Call(ctx, b.Addr(), opEcho, []byte("slow"))
		return err == nil && time.Since(start) >= 300*time.Millisecond
	})
	mustEcho(t, b, a, "duplicated")
	setRules(t, rulesA, "")
	waitFor(t, "a's sends on time again", 20*time.Second, func() bool {
		start := time.Now()
		return answers(a, b) && time.Since(start) < 300*time.Millisecond
	})
}
