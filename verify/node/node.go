// Package node runs one narad process for a verification run: build it (with the
// failpoints tag), start it on a free loopback port, wait for readiness, and hurt it —
// kill -9, SIGSTOP/SIGCONT — signalling only the PID it started itself. Output of every
// incarnation goes to one log file, and the failpoint lines on stderr are picked up so a
// run knows when and where a node killed itself.
package node

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FiredPrefix starts the stderr line a failpoint writes before it acts (it mirrors
// broker/internal/failpoint.FiredPrefix; the verify module cannot import broker internals).
const FiredPrefix = "narad failpoint fired:"

// Build compiles narad from brokerDir into out, with the failpoints tag when failpoints.
func Build(ctx context.Context, brokerDir, out string, failpoints bool) error {
	args := []string{"build", "-o", out}
	if failpoints {
		args = append(args, "-tags", "failpoints")
	}
	args = append(args, "./cmd/narad")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = brokerDir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building narad: %v\n%s", err, b)
	}
	return nil
}

// BuildTags compiles narad from brokerDir into out with the given build tags.
func BuildTags(ctx context.Context, brokerDir, out string, tags ...string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "-tags", strings.Join(tags, ","), "./cmd/narad")
	cmd.Dir = brokerDir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building narad (tags %v): %v\n%s", tags, err, b)
	}
	return nil
}

// FindBrokerDir walks up from the working directory to the repository's broker module.
func FindBrokerDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "broker", "cmd", "narad")); err == nil {
			return filepath.Join(dir, "broker"), nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no broker/cmd/narad above the working directory")
		}
		dir = up
	}
}

// FreeUDPPort returns a loopback UDP port nothing is bound to right now (a cluster
// node's --cluster-addr).
func FreeUDPPort() (int, error) {
	return unhanded("udp", func() (int, error) {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer func() { _ = c.Close() }() // only held to pick a free port
		return c.LocalAddr().(*net.UDPAddr).Port, nil
	})
}

// FreePort returns a loopback port nothing listens on right now.
func FreePort() (int, error) {
	return unhanded("tcp", func() (int, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer func() { _ = l.Close() }() // only held to pick a free port
		return l.Addr().(*net.TCPAddr).Port, nil
	})
}

// handedPorts are the ports FreePort and FreeUDPPort gave out in this process: the
// kernel can give a port just closed to the next ask again, and a cluster whose
// --peers named one address twice would fail to start.
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
		key := fmt.Sprintf("%s:%d", network, p)
		handedPorts.Lock()
		taken := handedPorts.m[key]
		handedPorts.m[key] = true
		handedPorts.Unlock()
		if !taken {
			return p, nil
		}
	}
	return 0, fmt.Errorf("node: no %s port that was not given out already in 100 tries", network)
}

// Options configures a Node.
type Options struct {
	Bin     string   // the narad binary
	DataDir string   // kept across restarts
	LogPath string   // every incarnation appends here
	Port    int      // 0: pick a free one (kept across restarts)
	Args    []string // extra serve flags
	// ID names the node in a cluster (its --node-id); empty for a single node.
	ID string
	// Env is added to the environment of every start (a cluster's secret, a chaosnet
	// rules file), before the start's own variables.
	Env []string
	// Host is the address the HTTP API listens on (default 127.0.0.1); with Netns, the
	// namespace's address.
	Host string
	// Netns runs every start inside that network namespace (`ip netns exec`, which
	// becomes the node: signals go to the node's own PID).
	Netns string
}

// Skip is a damaged record the node reported skipping (an ERROR line of its log).
type Skip struct {
	Log       string // "log": a message settled without delivery; "journal": a settle record lost on start; "fanout": a parent message never copied into Child
	Topic     string
	Child     string
	Partition int32
	Offset    int64 // the message's offset; -1 for a settle record
}

// Lines the broker logs when it skips a damaged record (broker/internal/partition).
const (
	skipMessageLine = `msg="a damaged message is skipped`
	skipSettleLine  = `msg="a damaged settle record is skipped`
	skipFanoutLine  = `msg="a damaged message is skipped by fan-out`
	// rebuiltLine ends both lines of a cluster replica whose damaged data is set aside
	// and copied afresh from its group (found on open, or met while serving): what it
	// skipped before is gone with that data, and the group's intact state is what it
	// serves from then on. So its skips are not reported: the checker then holds the
	// cluster to losing nothing.
	rebuiltLine = `set aside in damaged/ and rebuilt from the partition's group"`
)

var (
	attrTopic     = regexp.MustCompile(` topic=("(?:[^"\\]|\\.)*"|\S+)`)
	attrPartition = regexp.MustCompile(` partition=(\d+)`)
	attrOffset    = regexp.MustCompile(` offset=(\d+)`)
	attrChild     = regexp.MustCompile(` child=("(?:[^"\\]|\\.)*"|\S+)`)
)

// topicPartition reads a log line's topic and partition attributes.
func topicPartition(line string) (string, int32, bool) {
	m := attrTopic.FindStringSubmatch(line)
	p := attrPartition.FindStringSubmatch(line)
	if m == nil || p == nil {
		return "", 0, false
	}
	topic := m[1]
	if uq, err := strconv.Unquote(m[1]); err == nil {
		topic = uq
	}
	n, _ := strconv.ParseInt(p[1], 10, 32)
	return topic, int32(n), true
}

// parseRebuilt reads the partition of a replica's rebuild line (rebuiltLine).
func parseRebuilt(line string) (string, int32, bool) {
	if !strings.Contains(line, rebuiltLine) {
		return "", 0, false
	}
	return topicPartition(line)
}

// parseSkip reads a skip line of the broker's text log.
func parseSkip(line string) (Skip, bool) {
	s := Skip{Offset: -1}
	switch {
	case strings.Contains(line, skipFanoutLine):
		s.Log = "fanout"
	case strings.Contains(line, skipMessageLine):
		s.Log = "log"
	case strings.Contains(line, skipSettleLine):
		s.Log = "journal"
	default:
		return s, false
	}
	var ok bool
	if s.Topic, s.Partition, ok = topicPartition(line); !ok {
		return s, false
	}
	if s.Log == "fanout" {
		c := attrChild.FindStringSubmatch(line)
		if c == nil {
			return s, false
		}
		s.Child = c[1]
		if uq, err := strconv.Unquote(c[1]); err == nil {
			s.Child = uq
		}
	}
	if s.Log != "journal" {
		o := attrOffset.FindStringSubmatch(line)
		if o == nil {
			return s, false
		}
		s.Offset, _ = strconv.ParseInt(o[1], 10, 64)
	}
	return s, true
}

// Lead is a partition leadership the node took (its INFO line "leading partition",
// logged when the node runs with --log-level info or debug).
type Lead struct {
	Topic       string
	Partition   int32
	Incarnation int64
	Term        int64
	How         string // "handover" (the live leases were handed over) or "election"
}

const leadingLine = `msg="leading partition"`

var (
	attrTerm        = regexp.MustCompile(` term=(\d+)`)
	attrIncarnation = regexp.MustCompile(` incarnation=(\d+)`)
	attrBy          = regexp.MustCompile(` by=(\S+)`)
)

// parseLead reads a leading line of the broker's text log.
func parseLead(line string) (Lead, bool) {
	if !strings.Contains(line, leadingLine) {
		return Lead{}, false
	}
	var l Lead
	var ok bool
	if l.Topic, l.Partition, ok = topicPartition(line); !ok {
		return l, false
	}
	t, inc, by := attrTerm.FindStringSubmatch(line), attrIncarnation.FindStringSubmatch(line), attrBy.FindStringSubmatch(line)
	if t == nil || inc == nil || by == nil {
		return l, false
	}
	l.Term, _ = strconv.ParseInt(t[1], 10, 64)
	l.Incarnation, _ = strconv.ParseInt(inc[1], 10, 64)
	l.How = by[1]
	return l, true
}

// Fired is a failpoint that acted.
type Fired struct {
	Name, Action string
	UnixNano     int64 // the node's wall clock when it acted
	MonoNano     int64 // its CLOCK_MONOTONIC then (0 from a binary that does not say)
}

// Node is one narad process at a time, restarted on demand.
type Node struct {
	opts Options
	addr string
	log  *os.File

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	state   *os.ProcessState
	fired   []Fired
	skips   []Skip
	leads   []Lead
	gen     int
	paused  bool
	outDone chan struct{}
	// chaosnet: an incarnation said its node plane obeys a chaosnet rules file.
	chaosnet bool
	// fpFile: an incarnation said it reads a failpoints file.
	fpFile bool
}

// ChaosNetPrefix starts the stderr lines of a narad built with -tags chaosnet (it
// mirrors broker/internal/transport.ChaosNetPrefix).
const ChaosNetPrefix = "narad chaosnet:"

// FailpointsPrefix starts the stderr lines of a failpoints build about its failpoints
// file (it mirrors broker/internal/failpoint.FilePrefix).
const FailpointsPrefix = "narad failpoints:"

// FailpointsFile reports whether the node said it reads a failpoints file
// (NARAD_FAILPOINTS_FILE), whose content arms its failpoints while it runs.
func (n *Node) FailpointsFile() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fpFile
}

// ChaosNet reports whether the node said its node plane obeys a chaosnet rules file.
func (n *Node) ChaosNet() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.chaosnet
}

// New prepares a node; nothing runs until Start.
func New(opts Options) (*Node, error) {
	if opts.Port == 0 {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		opts.Port = p
	}
	if err := os.MkdirAll(opts.DataDir, 0o755); err != nil {
		return nil, err
	}
	lf, err := os.OpenFile(opts.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	return &Node{opts: opts, addr: net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)), log: lf}, nil
}

// Addr is host:port of the HTTP API.
func (n *Node) Addr() string { return n.addr }

// URL is the base URL of the HTTP API.
func (n *Node) URL() string { return "http://" + n.addr }

// ID is the node's cluster id ("" for a single node).
func (n *Node) ID() string { return n.opts.ID }

// DataDir is the node's data directory.
func (n *Node) DataDir() string { return n.opts.DataDir }

// LogPath is the node's log file.
func (n *Node) LogPath() string { return n.opts.LogPath }

// Gen counts the starts so far.
func (n *Node) Gen() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.gen
}

// Start starts a new incarnation with extra environment variables (e.g. NARAD_FAILPOINTS).
// The previous one must have exited.
func (n *Node) Start(env ...string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		select {
		case <-n.exited:
		default:
			return errors.New("node: still running")
		}
	}
	args := append([]string{"serve", "--http-addr", n.addr, "--data-dir", n.opts.DataDir}, n.opts.Args...)
	cmd := exec.Command(n.opts.Bin, args...)
	if n.opts.Netns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", n.opts.Netns, n.opts.Bin}, args...)...)
	}
	cmd.Env = append(append(os.Environ(), n.opts.Env...), env...)
	cmd.Stdout = n.log
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stderr = pw
	n.gen++
	fmt.Fprintf(n.log, "=== verify: start #%d at %s env=%q\n", n.gen, time.Now().Format(time.RFC3339Nano), env)
	if err := cmd.Start(); err != nil {
		_ = pr.Close() // the start error is the one to report
		_ = pw.Close()
		return err
	}
	_ = pw.Close() // the child holds its own copy of the write end
	n.cmd, n.exited, n.state, n.paused = cmd, make(chan struct{}), nil, false
	n.outDone = make(chan struct{})
	go n.copyStderr(pr, n.outDone)
	exited, outDone := n.exited, n.outDone
	go func() {
		_ = cmd.Wait() // how it ended is read from cmd.ProcessState
		<-outDone
		n.mu.Lock()
		n.state = cmd.ProcessState
		n.mu.Unlock()
		close(exited)
	}()
	return nil
}

func (n *Node) copyStderr(r io.ReadCloser, done chan struct{}) {
	defer close(done)
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		_, _ = n.log.WriteString(line + "\n") // the node's log, read by people; a full disk shows up in the checks
		if s, ok := parseSkip(line); ok {
			n.mu.Lock()
			n.skips = append(n.skips, s)
			n.mu.Unlock()
		}
		if l, ok := parseLead(line); ok {
			n.mu.Lock()
			n.leads = append(n.leads, l)
			n.mu.Unlock()
		}
		if topic, part, ok := parseRebuilt(line); ok {
			n.mu.Lock()
			n.skips = slices.DeleteFunc(n.skips, func(s Skip) bool { return s.Topic == topic && s.Partition == part })
			n.mu.Unlock()
		}
		if strings.HasPrefix(line, ChaosNetPrefix+" on ") {
			n.mu.Lock()
			n.chaosnet = true
			n.mu.Unlock()
		}
		if strings.HasPrefix(line, FailpointsPrefix+" file=") {
			n.mu.Lock()
			n.fpFile = true
			n.mu.Unlock()
		}
		if rest, ok := strings.CutPrefix(line, FiredPrefix); ok {
			f := Fired{}
			for _, kv := range strings.Fields(rest) {
				k, v, _ := strings.Cut(kv, "=")
				switch k {
				case "name":
					f.Name = v
				case "action":
					f.Action = v
				case "unix_nano":
					f.UnixNano, _ = strconv.ParseInt(v, 10, 64)
				case "mono_nano":
					f.MonoNano, _ = strconv.ParseInt(v, 10, 64)
				}
			}
			n.mu.Lock()
			n.fired = append(n.fired, f)
			n.mu.Unlock()
		}
	}
}

// TakeSkips returns the damaged records the node reported skipping since the last call.
func (n *Node) TakeSkips() []Skip {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.skips
	n.skips = nil
	return s
}

// TakeLeads returns the partition leaderships the node logged taking since the last
// call.
func (n *Node) TakeLeads() []Lead {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.leads
	n.leads = nil
	return l
}

// TakeFired returns the failpoints that acted since the last call.
func (n *Node) TakeFired() []Fired {
	n.mu.Lock()
	defer n.mu.Unlock()
	f := n.fired
	n.fired = nil
	return f
}

// Exited is closed when the current incarnation has exited (nil before the first Start).
func (n *Node) Exited() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exited
}

// Running reports whether the current incarnation is alive.
func (n *Node) Running() bool {
	ch := n.Exited()
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// ExitState describes how the last incarnation ended ("" while it runs).
func (n *Node) ExitState() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state == nil {
		return ""
	}
	return n.state.String()
}

// WaitReady polls /readyz until 200, the process exits, or timeout.
func (n *Node) WaitReady(timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	exited := n.Exited()
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("node exited before it was ready (%s); see %s", n.ExitState(), n.opts.LogPath)
		default:
		}
		resp, err := c.Get(n.URL() + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body) // drained so the connection is reused
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("node not ready within %v; see %s", timeout, n.opts.LogPath)
}

func (n *Node) signal(sig syscall.Signal) error {
	n.mu.Lock()
	cmd := n.cmd
	n.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return errors.New("node: not started")
	}
	return cmd.Process.Signal(sig)
}

// Kill sends SIGKILL (resuming nothing first: a stopped process dies as well) and waits
// for the exit.
func (n *Node) Kill() error {
	if !n.Running() {
		return nil
	}
	if err := n.signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-n.Exited()
	return nil
}

// Pause sends SIGSTOP.
func (n *Node) Pause() error {
	n.mu.Lock()
	n.paused = true
	n.mu.Unlock()
	return n.signal(syscall.SIGSTOP)
}

// Resume sends SIGCONT.
func (n *Node) Resume() error {
	n.mu.Lock()
	n.paused = false
	n.mu.Unlock()
	return n.signal(syscall.SIGCONT)
}

// Stop ends the node gracefully (SIGTERM), killing it after grace.
func (n *Node) Stop(grace time.Duration) error {
	if !n.Running() {
		return nil
	}
	n.mu.Lock()
	paused := n.paused
	n.mu.Unlock()
	if paused {
		_ = n.Resume() // a node that cannot be resumed does not exit on SIGTERM: killed below
	}
	_ = n.signal(syscall.SIGTERM) // it may have exited already; Exited says when it has
	select {
	case <-n.Exited():
		return nil
	case <-time.After(grace):
		_ = n.Kill() // the timeout is the error to report
		return fmt.Errorf("node did not stop within %v after SIGTERM; killed", grace)
	}
}

// Close stops the node (if running) and closes the log.
func (n *Node) Close() error {
	err := n.Stop(30 * time.Second)
	_ = n.log.Close() // the node's log, read by people
	return err
}

// Wipe deletes everything in the stopped node's data directory (a lost disk); the
// directory itself stays, empty.
func (n *Node) Wipe() error {
	if n.Running() {
		return errors.New("node: wipe of a running node")
	}
	ents, err := os.ReadDir(n.opts.DataDir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(n.opts.DataDir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// Paused reports whether the node was sent SIGSTOP and not resumed since.
func (n *Node) Paused() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paused
}

// Pid returns the current incarnation's process id (0 when none runs).
func (n *Node) Pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Usage reads the resident memory (bytes) and open file count of the running process.
func (n *Node) Usage() (rss int64, files int) {
	pid := n.Pid()
	if pid == 0 || !n.Running() {
		return 0, 0
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				f := strings.Fields(rest)
				if len(f) > 0 {
					kb, _ := strconv.ParseInt(f[0], 10, 64)
					rss = kb << 10
				}
			}
		}
	}
	if ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd"); err == nil {
		files = len(ents)
	}
	return rss, files
}

// FiredCount returns how many failpoint lines wait in TakeFired.
func (n *Node) FiredCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.fired)
}
