package narad_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// The tests run against the real broker binary, built once per test process from
// ../broker into a temp dir.
var (
	naradBin string
	shared   *brokerProc
	topicSeq atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "narad-sdk-go-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	naradBin = filepath.Join(dir, "narad")
	build := exec.Command("go", "build", "-o", naradBin, "./cmd/narad")
	build.Dir = filepath.Join(root, "broker")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the broker: %v\n%s", err, out)
		return 1
	}
	shared, err = startBroker(filepath.Join(dir, "shared"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the broker:", err)
		return 1
	}
	defer shared.stop()
	os.Setenv("NARAD_URL", shared.url)
	return m.Run()
}

// repoRoot walks up from the working directory to the folder holding go.work.
func repoRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.work")); err == nil {
			return d, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", errors.New("no go.work above the working directory")
		}
		d = up
	}
}

// brokerProc is one narad process started by the tests.
type brokerProc struct {
	url  string
	cmd  *exec.Cmd
	logs *lockedBuffer
	done chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 1<<20 {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func startBroker(dataDir string, env ...string) (*brokerProc, error) {
	var lastErr error
	for try := 0; try < 3; try++ {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		b, err := startBrokerOn(addr, dataDir, env...)
		if err == nil {
			return b, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// startBrokerOn starts narad on addr with extra environment (NAME=value) and waits
// until it is ready.
func startBrokerOn(addr, dataDir string, env ...string) (*brokerProc, error) {
	logs := &lockedBuffer{}
	cmd := exec.Command(naradBin, "serve", "--http-addr", addr, "--data-dir", dataDir, "--log-level", "warn", "--shutdown-grace", "2s")
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b := &brokerProc{url: "http://" + addr, cmd: cmd, logs: logs, done: make(chan struct{})}
	go func() { cmd.Wait(); close(b.done) }()
	if err := b.waitReady(30 * time.Second); err != nil {
		b.stop()
		return nil, fmt.Errorf("%w\n%s", err, logs.String())
	}
	return b, nil
}

func (b *brokerProc) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case <-b.done:
			return errors.New("the broker exited")
		default:
		}
		resp, err := http.Get(b.url + "/readyz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("the broker was not ready within " + limit.String())
}

// stop ends the process this test started: SIGTERM, then SIGKILL if it lingers.
func (b *brokerProc) stop() {
	select {
	case <-b.done:
		return
	default:
	}
	b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		b.cmd.Process.Kill()
		<-b.done
	}
}

// newClient returns a client of the shared broker, closed at the end of the test.
func newClient(t *testing.T, opts ...narad.Option) *narad.Client {
	t.Helper()
	return newClientAt(t, []string{shared.url}, opts...)
}

func newClientAt(t *testing.T, endpoints []string, opts ...narad.Option) *narad.Client {
	t.Helper()
	c, err := narad.New(endpoints, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// mustTopic creates a fresh topic with a unique name.
func mustTopic(t *testing.T, c *narad.Client, cfg narad.TopicConfig) string {
	t.Helper()
	name := fmt.Sprintf("t%d-%s", topicSeq.Add(1), strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 200 {
		name = name[:200]
	}
	if _, err := c.CreateTopic(ctxT(t), name, cfg); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	return name
}

// ctxT returns a context that ends with the test or after a generous bound.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or the bound passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// faultTransport wraps a RoundTripper and lets a test replace answers.
type faultTransport struct {
	next http.RoundTripper
	// fault is called before each request; it returns a response or error to use
	// instead of the real round trip, or (nil, nil) to go on. After the real round trip,
	// after (if set) may replace the outcome.
	mu    sync.Mutex
	fault func(*http.Request) (*http.Response, error)
	after func(*http.Request, *http.Response, error) (*http.Response, error)
}

func (f *faultTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	f.mu.Lock()
	fault, after := f.fault, f.after
	f.mu.Unlock()
	if fault != nil {
		if resp, err := fault(r); resp != nil || err != nil {
			if resp != nil {
				resp.Request = r
			}
			return resp, err
		}
	}
	resp, err := f.next.RoundTrip(r)
	if after != nil {
		return after(r, resp, err)
	}
	return resp, err
}

func (f *faultTransport) set(fault func(*http.Request) (*http.Response, error), after func(*http.Request, *http.Response, error) (*http.Response, error)) {
	f.mu.Lock()
	f.fault, f.after = fault, after
	f.mu.Unlock()
}

func newFaultClient(t *testing.T, opts ...narad.Option) (*narad.Client, *faultTransport) {
	ft := &faultTransport{next: http.DefaultTransport.(*http.Transport).Clone()}
	opts = append([]narad.Option{narad.WithHTTPClient(&http.Client{Transport: ft})}, opts...)
	return newClient(t, opts...), ft
}

func unavailable(retryAfter string) *http.Response {
	h := http.Header{"Content-Type": {"application/json"}}
	if retryAfter != "" {
		h.Set("Retry-After", retryAfter)
	}
	return &http.Response{StatusCode: 503, Header: h, Body: io.NopCloser(strings.NewReader(`{"error":{"code":"unavailable","message":"injected"}}`))}
}

// answer is a scripted broker answer: status, Retry-After ("" for none) and a JSON body.
func answer(status int, retryAfter, body string) *http.Response {
	h := http.Header{"Content-Type": {"application/json"}}
	if retryAfter != "" {
		h.Set("Retry-After", retryAfter)
	}
	return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(body))}
}
