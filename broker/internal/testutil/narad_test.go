package testutil

import (
	"net/http"
	"os"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	code := m.Run()
	RemoveBuild()
	os.Exit(code)
}

// TestNaradHarness starts the real binary, restarts it gracefully and after SIGKILL,
// and checks that the data directory, port and readiness carry over.
func TestNaradHarness(t *testing.T) {
	n := StartNarad(t, Options{Args: []string{"--default-partitions", "2"}})
	c := n.Client()
	if n.PID() == 0 || n.DataDir() == "" {
		t.Fatalf("PID %d, data dir %q", n.PID(), n.DataDir())
	}
	r := c.PostJSON("/v1/topics", map[string]any{"name": "kept"})
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	url, pid := n.URL(), n.PID()

	n.Restart()
	if n.URL() != url || n.PID() == pid || !n.Running() {
		t.Errorf("after Restart: url %s (was %s), pid %d (was %d), running %v", n.URL(), url, n.PID(), pid, n.Running())
	}
	if r := c.Get("/v1/topics/kept"); r.Status != http.StatusOK {
		t.Errorf("topic lost across a restart: %d %s", r.Status, r.Body)
	}

	n.RestartAfterKill()
	if r := c.Get("/v1/topics/kept"); r.Status != http.StatusOK {
		t.Errorf("topic lost across kill -9: %d %s", r.Status, r.Body)
	}

	n.Kill()
	if n.Running() {
		t.Errorf("running after Kill")
	}
	if _, err := c.Try("GET", "/healthz", nil); err == nil {
		t.Errorf("a killed broker still answers")
	}
	n.Stop() // no process: does nothing
}

func TestPoll(t *testing.T) {
	calls := 0
	if !Poll(time.Second, func() bool { calls++; return calls == 3 }) || calls != 3 {
		t.Errorf("Poll stopped after %d calls", calls)
	}
	start := time.Now()
	if Poll(50*time.Millisecond, func() bool { return false }) {
		t.Errorf("Poll of a false condition returned true")
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > 5*time.Second {
		t.Errorf("Poll with a 50 ms bound took %v", d)
	}
}
