package testutil

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Bounds of the process harness. They are generous: CI is a loaded 2-core machine.
const (
	readyTimeout = 30 * time.Second
	stopTimeout  = 30 * time.Second // SIGTERM to exit; the broker's grace is 25 s
	killTimeout  = 10 * time.Second
	startTries   = 5
)

// builds are the binaries built in this test process, by build tags.
var (
	buildMu  sync.Mutex
	buildDir string
	builds   = map[string]*build{}
)

type build struct {
	once sync.Once
	bin  string
	err  error
}

// BuildNarad builds the narad binary once per test process and returns its path
// (with -race when NARAD_TEST_BROKER_RACE=1).
func BuildNarad(t testing.TB) string {
	t.Helper()
	return BuildNaradTags(t, "")
}

// BuildNaradTags is BuildNarad with the build tags tags (comma-separated; "" for the
// shipped binary): e.g. "chaosnet" for a binary whose node plane obeys a rules file
// (transport.ChaosNetEnvVar). Each set of tags is built once per test process.
func BuildNaradTags(t testing.TB, tags string) string {
	t.Helper()
	buildMu.Lock()
	b := builds[tags]
	if b == nil {
		b = &build{}
		builds[tags] = b
	}
	buildMu.Unlock()
	b.once.Do(func() {
		mod, err := BrokerModuleDir()
		if err != nil {
			b.err = err
			return
		}
		buildMu.Lock()
		if buildDir == "" {
			buildDir, err = os.MkdirTemp("", "narad-e2e-bin-")
		}
		dir := buildDir
		buildMu.Unlock()
		if err != nil {
			b.err = err
			return
		}
		name := "narad"
		if tags != "" {
			name += "-" + strings.ReplaceAll(tags, ",", "-")
		}
		b.bin = filepath.Join(dir, name)
		args := []string{"build", "-o", b.bin}
		if tags != "" {
			args = append(args, "-tags", tags)
		}
		if brokerRace() {
			args = append(args, "-race")
		}
		args = append(args, "./cmd/narad")
		cmd := exec.Command(goTool(), args...)
		cmd.Dir = mod
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	})
	if b.err != nil {
		t.Fatalf("building narad: %v", b.err)
	}
	return b.bin
}

// brokerRace reports whether to build the broker with the race detector:
// NARAD_TEST_BROKER_RACE=1 turns it on, so a data race in the broker fails the test
// that ran it. It is off by default because a race-built broker is several times
// slower (bcrypt above all), which would put the e2e suite far past its time budget.
func brokerRace() bool { return os.Getenv("NARAD_TEST_BROKER_RACE") == "1" }

// RemoveBuild deletes the binaries BuildNarad and BuildNaradTags made; call it from
// TestMain after m.Run.
func RemoveBuild() {
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir) // a temp dir; the OS cleans it if this fails
	}
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	//lint:ignore SA1019 a test binary runs on the machine that built it, so its GOROOT is the toolchain that runs the tests
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// Options configures StartNarad.
type Options struct {
	// DataDir is the data directory; empty means a new t.TempDir().
	DataDir string
	// Args are extra flags for `narad serve`.
	Args []string
	// Env are extra environment variables (NAME=value). NARAD_* variables of the
	// test's own environment are not passed on, so a developer's settings cannot
	// change what a test sees.
	Env []string
	// Bin is the binary to run; empty means the one BuildNarad builds from this
	// checkout (an upgrade test runs a binary of an older commit).
	Bin string
}

// Narad is a running narad process started by StartNarad. Its methods are safe for
// concurrent use.
type Narad struct {
	t       testing.TB
	bin     string
	opts    Options
	dataDir string
	logPath string

	mu       sync.Mutex
	port     int
	cmd      *exec.Cmd
	done     chan struct{} // closed when cmd exits
	exitErr  error
	expected bool // the exit was asked for (Stop or Kill)
	starts   int
}

// StartNarad builds (once) and starts narad on 127.0.0.1 with a free port, waits
// until GET /readyz answers 200, and registers a cleanup that stops it and, when the
// test failed, prints its output.
func StartNarad(t testing.TB, opts Options) *Narad {
	t.Helper()
	bin := opts.Bin
	if bin == "" {
		bin = BuildNarad(t)
	}
	n := &Narad{t: t, bin: bin, opts: opts, dataDir: opts.DataDir}
	if n.dataDir == "" {
		n.dataDir = t.TempDir()
	}
	logDir := t.TempDir()
	n.logPath = filepath.Join(logDir, "narad.log")
	t.Cleanup(n.cleanup)

	var lastErr error
	for try := 0; try < startTries; try++ {
		port, err := FreePort()
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		n.mu.Lock()
		n.port = port
		n.mu.Unlock()
		lastErr = n.start()
		if lastErr == nil {
			return n
		}
		if !errors.Is(lastErr, errBind) {
			break
		}
	}
	t.Fatalf("starting narad: %v", lastErr)
	return nil
}

var errBind = errors.New("the port was taken")

// LaunchNarad is StartNarad without the wait: it starts the process and returns. Call
// WaitReady, or StartNarads to start several that need each other (a cluster's nodes
// bootstrapping from one peer list are not ready until all of them run).
func LaunchNarad(t testing.TB, opts Options) *Narad {
	t.Helper()
	bin := opts.Bin
	if bin == "" {
		bin = BuildNarad(t)
	}
	n := &Narad{t: t, bin: bin, opts: opts, dataDir: opts.DataDir}
	if n.dataDir == "" {
		n.dataDir = t.TempDir()
	}
	n.logPath = filepath.Join(t.TempDir(), "narad.log")
	t.Cleanup(n.cleanup)
	port, err := FreePort()
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	n.port = port
	if err := n.launch(); err != nil {
		t.Fatalf("starting narad: %v", err)
	}
	return n
}

// WaitReady waits until the process launched last answers GET /readyz with 200,
// starting it again on another HTTP port when its port was taken. It returns the
// error instead of failing the test.
func (n *Narad) WaitReady() error {
	for try := 0; ; try++ {
		n.mu.Lock()
		done := n.done
		n.mu.Unlock()
		err := n.waitReady(done)
		if err == nil || !errors.Is(err, errBind) || try >= startTries {
			return err
		}
		port, perr := FreePort()
		if perr != nil {
			return perr
		}
		n.mu.Lock()
		n.port = port
		n.mu.Unlock()
		if err := n.launch(); err != nil {
			return err
		}
	}
}

// StartNarads launches one narad per Options at once and waits until all are ready.
func StartNarads(t testing.TB, opts ...Options) []*Narad {
	t.Helper()
	ns := make([]*Narad, len(opts))
	for i, o := range opts {
		ns[i] = LaunchNarad(t, o)
	}
	WaitAllReady(t, ns...)
	return ns
}

// WaitAllReady waits, in parallel, until every one of ns is ready.
func WaitAllReady(t testing.TB, ns ...*Narad) {
	t.Helper()
	errs := make([]error, len(ns))
	var wg sync.WaitGroup
	for i, n := range ns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.WaitReady()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("starting narads: %v", err)
	}
}

// Relaunch starts a stopped narad again on its data directory and port with other
// flags, environment and binary (as an upgrade or a rollback does), without waiting.
// opts.DataDir is ignored: the data directory stays.
func (n *Narad) Relaunch(opts Options) {
	n.t.Helper()
	n.mu.Lock()
	if opts.Bin == "" {
		opts.Bin = BuildNarad(n.t)
	}
	opts.DataDir = n.opts.DataDir
	n.opts, n.bin = opts, opts.Bin
	n.mu.Unlock()
	n.Launch()
}

// Options returns the options the narad was last started with (for Relaunch).
func (n *Narad) Options() Options {
	n.mu.Lock()
	defer n.mu.Unlock()
	o := n.opts
	o.Env = slices.Clone(o.Env)
	return o
}

// Launch starts a stopped narad again on its data directory and port, without waiting
// (see WaitReady, WaitAllReady).
func (n *Narad) Launch() {
	n.t.Helper()
	if err := n.launch(); err != nil {
		n.t.Fatalf("starting narad again: %v", err)
	}
}

// FreeUDPPort returns a UDP port on 127.0.0.1 that was free a moment ago (for
// --cluster-addr).
func FreeUDPPort() (int, error) {
	return unhanded("udp", func() (int, error) {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer func() { _ = c.Close() }() // only the port number was wanted
		return c.LocalAddr().(*net.UDPAddr).Port, nil
	})
}

// handedPorts are the ports FreePort and FreeUDPPort gave out in this process: the
// kernel can give a port just closed to the next ask again, and a cluster whose
// --peers named one address twice failed to start.
var handedPorts = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}

// unhanded calls pick until it returns a port of network not given out before.
func unhanded(network string, pick func() (int, error)) (int, error) {
	for range 100 {
		p, err := pick()
		if err != nil {
			return 0, err
		}
		key := network + ":" + strconv.Itoa(p)
		handedPorts.Lock()
		taken := handedPorts.m[key]
		handedPorts.m[key] = true
		handedPorts.Unlock()
		if !taken {
			return p, nil
		}
	}
	return 0, fmt.Errorf("testutil: no %s port that was not given out already in 100 tries", network)
}

// Pause stops the process with SIGSTOP (it keeps its sockets and answers nothing)
// and returns once every thread of it has stopped: a signal is delivered to each
// thread when it is next scheduled, so on a loaded machine a process just sent
// SIGSTOP can still answer a request a few milliseconds later. Resume continues it.
// The cleanup resumes a paused process before stopping it.
func (n *Narad) Pause() {
	n.t.Helper()
	n.signal(syscall.SIGSTOP)
	pid := n.PID()
	deadline := time.Now().Add(killTimeout)
	for !stopped(pid) {
		if time.Now().After(deadline) {
			n.t.Fatalf("narad (pid %d) did not stop within %v of SIGSTOP", pid, killTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// stopped reports whether every thread of process pid is stopped (state T in
// /proc/<pid>/task/<tid>/stat). Without /proc (not Linux) it reports true.
func stopped(pid int) bool {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return true
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if err != nil {
			continue // the thread ended
		}
		// The state follows the command name, which is in parentheses and may hold any
		// character: read after the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return false
		}
		if st := b[i+2]; st != 'T' && st != 't' {
			return false
		}
	}
	return true
}

// Reload sends SIGHUP (the node rereads its TLS certificate and cluster secrets).
func (n *Narad) Reload() { n.signal(syscall.SIGHUP) }

// Resume continues a process stopped by Pause.
func (n *Narad) Resume() { n.signal(syscall.SIGCONT) }

// Wait waits up to timeout for the process to exit on its own and returns its exit
// error; ok is false when it still runs. The exit counts as expected.
func (n *Narad) Wait(timeout time.Duration) (err error, ok bool) {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if done == nil {
		return nil, false
	}
	select {
	case <-done:
	case <-time.After(timeout):
		return nil, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.expected = true
	return n.exitErr, true
}

// FreePort returns a port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	return unhanded("tcp", func() (int, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer func() { _ = ln.Close() }() // only held to pick a free port
		return ln.Addr().(*net.TCPAddr).Port, nil
	})
}

func (n *Narad) start() error {
	if err := n.launch(); err != nil {
		return err
	}
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	return n.waitReady(done)
}

// launch starts the process and returns at once.
func (n *Narad) launch() error {
	n.mu.Lock()
	if n.cmd != nil && !n.exited() {
		n.mu.Unlock()
		return errors.New("testutil: narad is already running")
	}
	n.starts++
	addr := "127.0.0.1:" + strconv.Itoa(n.port)
	args := append([]string{"serve", "--http-addr", addr, "--data-dir", n.dataDir}, n.opts.Args...)
	cmd := exec.Command(n.bin, args...)
	cmd.Env = append(filterEnv(os.Environ()), n.opts.Env...)
	cmd.SysProcAttr = procAttr()
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		n.mu.Unlock()
		return err
	}
	fmt.Fprintf(logf, "=== start %d: %s %s\n", n.starts, n.bin, strings.Join(args, " "))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close() // the start error is the one to report
		n.mu.Unlock()
		return err
	}
	done := make(chan struct{})
	n.cmd, n.done, n.exitErr, n.expected = cmd, done, nil, false
	n.mu.Unlock()
	go func() {
		err := cmd.Wait()
		_ = logf.Close() // the node's output log; a test reads it only to explain a failure
		n.mu.Lock()
		n.exitErr = err
		n.mu.Unlock()
		close(done)
	}()
	return nil
}

func filterEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "NARAD_") {
			out = append(out, kv)
		}
	}
	return out
}

// waitReady polls /readyz until 200, the process exits, or readyTimeout passes.
func (n *Narad) waitReady(done chan struct{}) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	url := n.URL() + "/readyz"
	deadline := time.Now().Add(readyTimeout)
	for delay := 10 * time.Millisecond; ; {
		select {
		case <-done:
			log := n.Log()
			if strings.Contains(log, "address already in use") {
				return errBind
			}
			return fmt.Errorf("narad exited before it was ready (%v); its output:\n%s", n.exitError(), log)
		default:
		}
		if resp, err := hc.Get(url); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			// The 503s of a starting broker are responses too: check them.
			if v, verr := LoadOpenAPIValidator(); verr == nil {
				if err := v.ValidateResponse(resp.Request, resp.StatusCode, resp.Header, body); err != nil {
					n.t.Errorf("response does not match openapi.yaml: GET /readyz -> %d: %v\nbody: %s", resp.StatusCode, err, truncateBytes(body, 500))
				}
			}
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			n.signal(syscall.SIGKILL)
			<-done
			return fmt.Errorf("narad not ready after %v; its output:\n%s", readyTimeout, n.Log())
		}
		time.Sleep(delay)
		if delay < 100*time.Millisecond {
			delay *= 2
		}
	}
}

// exited reports whether the current process has exited; n.mu must be held.
func (n *Narad) exited() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

func (n *Narad) exitError() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exitErr
}

// signal sends sig to the process this harness started, by PID.
func (n *Narad) signal(sig syscall.Signal) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil || n.exited() {
		return
	}
	_ = n.cmd.Process.Signal(sig) // the process may have exited already; Wait reports how it ended
}

// URL returns the broker's base URL, http://127.0.0.1:PORT.
func (n *Narad) URL() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return "http://127.0.0.1:" + strconv.Itoa(n.port)
}

// DataDir returns the data directory.
func (n *Narad) DataDir() string { return n.dataDir }

// PID returns the current process's id (0 when none was started).
func (n *Narad) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Client returns a validating client for this broker.
func (n *Narad) Client() *Client { return NewClient(n.t, n.URL()) }

// Running reports whether the process is up.
func (n *Narad) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil && !n.exited()
}

// Stop sends SIGTERM and waits for the exit; past its bound it sends SIGKILL. A
// graceful stop must exit 0 (and, under -race, report no data race); anything else
// fails the test.
func (n *Narad) Stop() {
	n.t.Helper()
	done := n.markExpected()
	if done == nil {
		return
	}
	n.signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(stopTimeout):
		n.t.Errorf("narad (pid %d) did not exit within %v of SIGTERM; killing it", n.PID(), stopTimeout)
		n.signal(syscall.SIGKILL)
		<-done
		return
	}
	if err := n.exitError(); err != nil {
		n.t.Errorf("narad (pid %d) exited with %v after SIGTERM; want exit 0", n.PID(), err)
	}
}

// Kill sends SIGKILL and waits for the exit.
func (n *Narad) Kill() {
	n.t.Helper()
	done := n.markExpected()
	if done == nil {
		return
	}
	n.signal(syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(killTimeout):
		n.t.Fatalf("narad (pid %d) did not exit within %v of SIGKILL", n.PID(), killTimeout)
	}
}

// markExpected records that the coming exit is asked for and returns the exit
// channel, or nil when there is no running process.
func (n *Narad) markExpected() chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return nil
	}
	if n.exited() {
		if !n.expected {
			n.t.Errorf("narad (pid %d) had exited on its own: %v", n.cmd.Process.Pid, n.exitErr)
		}
		n.expected = true
		return nil
	}
	n.expected = true
	return n.done
}

// Restart stops the broker (gracefully) if it runs, then starts it again on the same
// data directory and port and waits until it is ready.
func (n *Narad) Restart() {
	n.t.Helper()
	n.Stop()
	n.startAgain()
}

// RestartAfterKill kills the broker with SIGKILL, then starts it again on the same data
// directory and port.
func (n *Narad) RestartAfterKill() {
	n.t.Helper()
	n.Kill()
	n.startAgain()
}

func (n *Narad) startAgain() {
	n.t.Helper()
	var err error
	// The port was ours a moment ago; a bind failure can only be transient.
	for try := 0; try < startTries; try++ {
		if err = n.start(); err == nil || !errors.Is(err, errBind) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		n.t.Fatalf("restarting narad: %v", err)
	}
}

// Log returns everything the broker wrote to stdout and stderr, across restarts.
func (n *Narad) Log() string {
	b, err := os.ReadFile(n.logPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", n.logPath, err)
	}
	return string(b)
}

func (n *Narad) cleanup() {
	n.mu.Lock()
	unexpected := n.cmd != nil && n.exited() && !n.expected
	exitErr := n.exitErr
	if unexpected {
		n.expected = true
	}
	n.mu.Unlock()
	if unexpected {
		n.t.Errorf("narad exited during the test without being asked to: %v", exitErr)
	}
	n.Resume() // a paused process would ignore SIGTERM until continued
	keep := os.Getenv("NARAD_TEST_KEEP")
	if keep != "" && n.t.Failed() {
		n.dumpStacks()
	} else {
		n.Stop()
	}
	log := n.Log()
	if strings.Contains(log, "WARNING: DATA RACE") {
		n.t.Errorf("the broker reported a data race")
	}
	if strings.Contains(log, "panic:") || strings.Contains(log, "handler panicked") {
		n.t.Errorf("the broker panicked")
	}
	if n.t.Failed() {
		n.t.Logf("narad output (%s):\n%s", n.logPath, tail(log, 64<<10))
		if keep != "" {
			n.keepLog(keep, log)
		}
	}
}

// dumpStacks ends a broker that is still running with SIGQUIT, so its log ends with
// every goroutine's stack: what a failed test left waiting, for NARAD_TEST_KEEP.
func (n *Narad) dumpStacks() {
	done := n.markExpected()
	if done == nil {
		return
	}
	n.signal(syscall.SIGQUIT)
	select {
	case <-done:
	case <-time.After(killTimeout):
		n.signal(syscall.SIGKILL)
		<-done
	}
}

// keepLog copies a failed test's broker log into dir (NARAD_TEST_KEEP), named by the
// test and the process, since the test's own temporary directories are removed.
func (n *Narad) keepLog(dir, log string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		n.t.Logf("NARAD_TEST_KEEP: %v", err)
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(n.t.Name())
	path := filepath.Join(dir, fmt.Sprintf("%s-%d-%d.log", name, n.PID(), time.Now().UnixNano()))
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		n.t.Logf("NARAD_TEST_KEEP: %v", err)
		return
	}
	n.t.Logf("kept the broker's log (with its goroutines' stacks) in %s", path)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n
	if j := bytes.IndexByte([]byte(s[i:]), '\n'); j >= 0 {
		i += j + 1
	}
	return "…\n" + s[i:]
}
