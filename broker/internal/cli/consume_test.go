package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAConsumeCutBySignalHandsBackWhatItDidNotPrint: a consume's poll is answered just
// after Ctrl-C (the broker leased the messages and sent them as the signal came). The
// SDK reads that answer rather than dropping it with its leases, and the CLI, stopped,
// prints none of it and hands every message back at once (a nack with no delay), so
// another consumer gets them now rather than after the visibility timeout; it acks
// nothing it did not print.
func TestAConsumeCutBySignalHandsBackWhatItDidNotPrint(t *testing.T) {
	for _, follow := range []bool{false, true} {
		t.Run(fmt.Sprintf("follow=%v", follow), func(t *testing.T) {
			arrived := make(chan struct{})
			release := make(chan struct{})
			var mu sync.Mutex
			var settled []string
			var polls int
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				switch {
				case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/consume-batch"):
					mu.Lock()
					polls++
					first := polls == 1
					mu.Unlock()
					if !first {
						w.WriteHeader(http.StatusNoContent)
						return
					}
					close(arrived)
					select { // the answer leaves as the signal comes
					case <-release:
					case <-r.Context().Done():
						return
					}
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"messages":[`+
						`{"topic":"t","partition":0,"offset":0,"payload":"b25l","payload_encoding":"base64","timestamp":1,"receipt_handle":"h0","delivery_attempt":1},`+
						`{"topic":"t","partition":0,"offset":1,"payload":"dHdv","payload_encoding":"base64","timestamp":1,"receipt_handle":"h1","delivery_attempt":1}]}`)
				case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/ack"):
					mu.Lock()
					settled = append(settled, "ack "+r.URL.Query().Get("receipt_handle")+" extend="+r.URL.Query().Get("extend"))
					mu.Unlock()
					w.WriteHeader(http.StatusNoContent)
				case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/ack-batch"):
					mu.Lock()
					settled = append(settled, "ack-batch")
					mu.Unlock()
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"results":[]}`)
				default:
					w.WriteHeader(http.StatusNotFound)
				}
			}))
			defer srv.Close()
			vars := map[string]string{"NARAD_URL": srv.URL, "NARAD_CLI_CONFIG": filepath.Join(t.TempDir(), "contexts.json")}
			args := []string{"consume", "t", "--wait", "5s"}
			if follow {
				args = append(args, "--follow")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan ran, 1)
			go func() {
				var stdout, stderr bytes.Buffer
				code := Run(ctx, args, IO{Stdout: &stdout, Stderr: &stderr, Stdin: strings.NewReader(""), Getenv: func(k string) string { return vars[k] }})
				done <- ran{code, stdout.String(), stderr.String()}
			}()
			select {
			case <-arrived:
			case <-time.After(30 * time.Second):
				t.Fatal("no poll arrived")
			}
			cancel() // Ctrl-C
			close(release)
			var r ran
			select {
			case r = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("consume still running 30 s after the signal")
			}
			mu.Lock()
			got := strings.Join(settled, "; ")
			mu.Unlock()
			if want := "ack h0 extend=0; ack h1 extend=0"; got != want {
				t.Errorf("settlements after the signal: %q; want both messages handed back at once (%q)", got, want)
			}
			if r.stdout != "" {
				t.Errorf("printed %q after the signal; want nothing (what is printed is acked, and the signal came first)", r.stdout)
			}
			if follow && r.code != ExitOK || !follow && r.code != ExitFailed {
				t.Errorf("exit %d (stderr %q); want the exit of a consume stopped by a signal", r.code, r.stderr)
			}
		})
	}
}
