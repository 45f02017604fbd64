// Package naradtest starts a real narad broker for tests: on a free loopback port, with
// a temporary data directory, stopped when the test ends. Like Pub/Sub's pstest, but
// the broker under test is the real one, not an imitation.
//
//	func TestOrders(t *testing.T) {
//		srv := naradtest.Start(t)
//		c, err := narad.New([]string{srv.URL})
//		...
//	}
//
// The binary is, in order: Options.Binary, $NARAD_BIN, or narad on the PATH. The test
// is failed (not skipped) when none is found, so a missing broker is never mistaken for
// a passing test.
package naradtest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/narad-mq/narad/sdk-go/api"
)

// Options configure Start. The zero value is fine.
type Options struct {
	// Binary is the narad executable; "" means $NARAD_BIN, then narad on the PATH.
	Binary string
	// Args are extra arguments to `narad serve`.
	Args []string
	// Env are extra NAME=value environment entries for the broker.
	Env []string
	// ReadyTimeout bounds the wait for /readyz (default 60 s).
	ReadyTimeout time.Duration
}

// Server is a running broker.
type Server struct {
	// URL is the broker's base URL, such as http://127.0.0.1:41234.
	URL string
	// DataDir is its temporary data directory.
	DataDir string

	cmd  *exec.Cmd
	done chan struct{}
	logs *logBuffer
}

// Start starts a broker for t with the default options.
func Start(t testing.TB) *Server { return StartWith(t, Options{}) }

// StartWith starts a broker for t; it is stopped by t.Cleanup.
func StartWith(t testing.TB, o Options) *Server {
	t.Helper()
	bin, err := findBinary(o.Binary)
	if err != nil {
		t.Fatal(err)
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 60 * time.Second
	}
	dir := t.TempDir()
	var lastErr error
	for try := 0; try < 3; try++ { // a free port can be taken between probe and bind
		s, err := start(bin, dir, o)
		if err == nil {
			t.Cleanup(s.Stop)
			return s
		}
		lastErr = err
	}
	t.Fatalf("naradtest: %v", lastErr)
	return nil
}

func findBinary(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if b := os.Getenv("NARAD_BIN"); b != "" {
		return b, nil
	}
	b, err := exec.LookPath("narad")
	if err != nil {
		return "", errors.New("naradtest: no narad binary: set NARAD_BIN, put narad on the PATH, or pass Options.Binary")
	}
	return b, nil
}

func start(bin, dir string, o Options) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	_ = l.Close() // only held to pick a free port
	args := append([]string{"serve", "--http-addr", addr, "--data-dir", dir, "--log-level", "warn", "--shutdown-grace", "2s"}, o.Args...)
	logs := &logBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Env = append(os.Environ(), o.Env...)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s := &Server{URL: "http://" + addr, DataDir: dir, cmd: cmd, done: make(chan struct{}), logs: logs}
	go func() { _ = cmd.Wait(); close(s.done) }() // how it ended is in s.logs
	if err := s.waitReady(o.ReadyTimeout); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%w\n%s", err, logs.String())
	}
	return s, nil
}

func (s *Server) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	hc := &http.Client{Timeout: 2 * time.Second}
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return errors.New("the broker exited before it was ready")
		default:
		}
		req, err := api.NewReadyzRequest(s.URL + "/")
		if err != nil {
			return fmt.Errorf("the broker's address %q is not a URL: %w", s.URL, err)
		}
		if resp, err := hc.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body) // drained so the connection is reused
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, with a deadline
	}
	return fmt.Errorf("the broker was not ready within %s", limit)
}

// Stop ends the broker (SIGTERM, then SIGKILL after 10 s). Calling it twice is harmless;
// Start registers it with t.Cleanup.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM) // it may have exited already; s.done says when it has
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill() // it may have exited already; s.done says when it has
		<-s.done
	}
}

// Logs returns what the broker wrote so far (the first MiB).
func (s *Server) Logs() string { return s.logs.String() }

type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 1<<20 {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
