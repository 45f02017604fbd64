package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// TestAProduceCutBySignalFailsAndStops: a produce stopped by SIGINT or SIGTERM before
// it sent all it was asked to exits non-zero and says so, whether it was sending
// (--count) or waiting for a line of stdin that had not come (an interactive stdin,
// tail -f), which it used to wait for past the signal.
func TestAProduceCutBySignalFailsAndStops(t *testing.T) {
	f := &fakeAPI{answers: map[string]fakeAnswer{
		"POST /v1/topics/t/produce": {202, `{"topic":"t","partition":0,"offset":0}`},
	}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	vars := map[string]string{"NARAD_URL": srv.URL, "NARAD_CLI_CONFIG": filepath.Join(t.TempDir(), "contexts.json")}
	var printed testutil.LockedBuffer // what the run going on has printed so far
	run := func(stdin io.Reader, args ...string) (chan ran, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan ran, 1)
		printed.Reset()
		go func() {
			var stderr bytes.Buffer
			code := Run(ctx, args, IO{Stdout: &printed, Stderr: &stderr, Stdin: stdin, Getenv: func(k string) string { return vars[k] }})
			done <- ran{code, printed.String(), stderr.String()}
		}()
		return done, cancel
	}
	sent := func() int { return len(f.sent()) }
	waitSent := func(n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for sent() < n {
			if time.Now().After(deadline) {
				t.Fatalf("the produce sent %d requests, want %d", sent(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	finished := func(done chan ran, what string) ran {
		t.Helper()
		select {
		case r := <-done:
			return r
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: still running 30 s after the signal", what)
			return ran{}
		}
	}

	// Sending: a million messages, cut after the first.
	done, cancel := run(strings.NewReader(""), "produce", "t", "x", "--count", "1000000")
	waitSent(1)
	cancel()
	if r := finished(done, "produce --count"); r.code != ExitFailed || !strings.Contains(r.stderr, "stopped by a signal") {
		t.Errorf("produce --count cut by a signal: %+v", r)
	}

	// Waiting for stdin: one line came, the next never does.
	before := sent()
	pr, pw := io.Pipe()
	defer pw.Close()
	done, cancel = run(pr, "produce", "t")
	if _, err := io.WriteString(pw, "one\n"); err != nil {
		t.Fatal(err)
	}
	waitSent(before + 1)
	// Cut once the line's answer is printed: a signal before it (the request sent, its
	// answer on its way) fails that produce, which is not what this part is about.
	for deadline := time.Now().Add(30 * time.Second); printed.String() != "0\t0\n"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the produce of the first line printed %q", printed.String())
		}
	}
	cancel()
	if r := finished(done, "produce from stdin"); r.code != ExitFailed || !strings.Contains(r.stderr, "stopped by a signal") || r.stdout != "0\t0\n" {
		t.Errorf("produce from stdin cut by a signal: %+v", r)
	}

	// --file - waiting for the end of stdin.
	pr2, pw2 := io.Pipe()
	defer pw2.Close()
	done, cancel = run(pr2, "produce", "t", "--file", "-")
	cancel()
	if r := finished(done, "produce --file -"); r.code != ExitFailed {
		t.Errorf("produce --file - cut by a signal: %+v", r)
	}
}

// TestASignalDuringAProducesAnswerSaysItMayBeStored: a produce whose request was sent
// and whose answer had not come when the signal cut it may be stored. The CLI says so,
// so that whoever reads its error does not send the message again believing it lost.
func TestASignalDuringAProducesAnswerSaysItMayBeStored(t *testing.T) {
	arrived := make(chan struct{}, 16)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		select { // the answer is on its way: the message is stored, say
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	vars := map[string]string{"NARAD_URL": srv.URL, "NARAD_CLI_CONFIG": filepath.Join(t.TempDir(), "contexts.json")}
	for _, args := range [][]string{{"produce", "t", "x"}, {"produce", "t", "x", "--batch"}} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan ran, 1)
		go func() {
			var stdout, stderr bytes.Buffer
			code := Run(ctx, args, IO{Stdout: &stdout, Stderr: &stderr, Stdin: strings.NewReader(""), Getenv: func(k string) string { return vars[k] }})
			done <- ran{code, stdout.String(), stderr.String()}
		}()
		select {
		case <-arrived:
		case <-time.After(30 * time.Second):
			t.Fatalf("%v: no request arrived", args)
		}
		cancel()
		var r ran
		select {
		case r = <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%v: still running 30 s after the signal", args)
		}
		if r.code != ExitFailed || !strings.Contains(r.stderr, "may be stored") {
			t.Errorf("%v cut while its answer was awaited: %+v; want a failure that says the message may be stored", args, r)
		}
	}
}
