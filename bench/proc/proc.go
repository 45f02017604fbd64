// Package proc starts the server processes a benchmark measures (narad, nats-server,
// redis-server) on free loopback ports and samples their CPU time and resident memory
// from /proc, so every broker is observed the same way.
package proc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNotReady is returned by Start when the server did not become ready in time.
var ErrNotReady = errors.New("server did not become ready")

// Process is a server started by Start. Stop ends it; nothing else does.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
}

// Start runs cmd (its stdout and stderr go to log) and polls ready every 50 ms until
// it returns nil, the process exits, or timeout passes; on failure the process is
// stopped. The child gets SIGKILL if the benchmark dies, so a killed run leaves no
// server behind.
func Start(cmd *exec.Cmd, log io.Writer, timeout time.Duration, ready func(context.Context) error) (*Process, error) {
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited before it was ready: %v", cmd.Path, cmd.ProcessState)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		last = ready(ctx)
		cancel()
		if last == nil {
			return p, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.Stop()
	return nil, fmt.Errorf("%w in %s: %v", ErrNotReady, timeout, last)
}

// PID is the server's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Stop sends SIGTERM, waits up to 30 s for the exit, then kills. It is idempotent.
func (p *Process) Stop() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

// Kill ends the server with SIGKILL, as a crash would, and waits for it to exit. A
// later Stop does nothing.
func (p *Process) Kill() error {
	var err error
	p.once.Do(func() {
		err = p.cmd.Process.Kill()
		<-p.done
	})
	return err
}

// FreeAddr returns a 127.0.0.1:port that was free a moment ago.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = ln.Close() }() // only held to pick a free port
	return ln.Addr().String(), nil
}

// FreeUDPAddr returns a 127.0.0.1:port whose UDP port was free a moment ago, for a
// node plane (QUIC) to bind.
func FreeUDPAddr() (string, error) {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }() // only held to pick a free port
	return c.LocalAddr().String(), nil
}

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat. It is 100 on
// every Linux architecture Go supports; reading it needs sysconf, hence cgo.
const clockTicks = 100

// CPUTime is the user+system CPU time of pid and of its children it waited for
// (fields 14-17 of /proc/<pid>/stat).
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may contain spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime, stime, cutime, cstime are fields 14 to 17.
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var ticks int64
	for _, s := range f[11:15] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// RSS is the resident set size of pid in bytes (VmRSS of /proc/<pid>/status).
func RSS(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }() // opened read-only
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		if !strings.HasPrefix(line, "VmRSS:") {
			continue
		}
		f := strings.Fields(line[len("VmRSS:"):])
		if len(f) < 1 {
			break
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, err
		}
		return kb * 1024, nil
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// Usage is what a Sampler saw of one process over one phase.
type Usage struct {
	// CPU is CPU time over wall time: 1.5 means one and a half cores busy on average.
	CPU float64 `json:"cpu_cores"`
	// RSSPeak and RSSLast are the largest and the last VmRSS sampled, in bytes.
	RSSPeak int64 `json:"rss_peak_bytes"`
	RSSLast int64 `json:"rss_last_bytes"`
}

// Sampler watches one process from Sample to Stop.
type Sampler struct {
	pid   int
	start time.Time
	cpu0  time.Duration
	err   error
	stop  chan struct{}
	done  chan struct{}
	peak  int64
	last  int64
}

// Sample starts sampling pid's RSS every interval. A pid of 0 gives a sampler whose
// Stop reports ok == false.
func Sample(pid int, interval time.Duration) *Sampler {
	s := &Sampler{pid: pid, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	if pid == 0 {
		close(s.done)
		return s
	}
	s.cpu0, s.err = CPUTime(pid)
	go func() {
		defer close(s.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s.rss()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *Sampler) rss() {
	r, err := RSS(s.pid)
	if err != nil {
		return
	}
	s.last = r
	if r > s.peak {
		s.peak = r
	}
}

// Stop ends sampling and returns the usage since Sample; ok is false when the process
// could not be read.
func (s *Sampler) Stop() (u Usage, ok bool) {
	if s.pid == 0 {
		return Usage{}, false
	}
	close(s.stop)
	<-s.done
	s.rss()
	cpu1, err := CPUTime(s.pid)
	if err != nil || s.err != nil {
		return Usage{}, false
	}
	wall := time.Since(s.start)
	return Usage{CPU: (cpu1 - s.cpu0).Seconds() / wall.Seconds(), RSSPeak: s.peak, RSSLast: s.last}, true
}
