//go:build failpoints

package failpoint

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Enabled reports whether this binary was built with the failpoints tag.
const Enabled = true

type point struct {
	action string
	sleep  time.Duration
	at     int64 // act on this hit only (or from it on, with on); 0: every hit
	on     bool  // @N+: act on the N-th hit and every one after it
	hits   atomic.Int64
	// sleeping counts the point's sleeps under way: raised just before the sleep,
	// after the fired line is written (a write that may block on a slow reader).
	sleeping atomic.Int64
}

var (
	mu     sync.RWMutex
	points = map[string]*point{}
)

var (
	clockOffset time.Duration
	clockDrift  float64
)

func init() {
	if err := Set(os.Getenv(EnvVar)); err != nil {
		fmt.Fprintf(os.Stderr, "narad: %s: %v\n", EnvVar, err)
		os.Exit(2)
	}
	if path := os.Getenv(FileEnvVar); path != "" {
		fmt.Fprintf(os.Stderr, "%s file=%s\n", FilePrefix, path)
		go pollFile(path, FilePoll)
	}
	if v := os.Getenv(ClockEnvVar); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "narad: %s: %v\n", ClockEnvVar, err)
			os.Exit(2)
		}
		clockOffset = d
	}
	if v := os.Getenv(ClockDriftEnvVar); v != "" {
		d, err := strconv.ParseFloat(v, 64)
		if err != nil || d <= -0.5 || d >= 0.5 {
			fmt.Fprintf(os.Stderr, "narad: %s: %q is not a drift between -0.5 and 0.5 (seconds gained per second)\n", ClockDriftEnvVar, v)
			os.Exit(2)
		}
		clockDrift = d
	}
}

// ClockOffset is the shift of the wall clock set by ClockEnvVar at start.
func ClockOffset() time.Duration { return clockOffset }

// ClockDrift is how many seconds a second the wall clock gains (negative: loses), set
// by ClockDriftEnvVar at start.
func ClockDrift() float64 { return clockDrift }

// Set replaces every armed point with those of spec (the NARAD_FAILPOINTS syntax); an
// empty spec disarms them all. Tests in the storage packages use it directly.
func Set(spec string) error {
	next := map[string]*point{}
	for _, ent := range strings.Split(spec, ";") {
		ent = strings.TrimSpace(ent)
		if ent == "" {
			continue
		}
		name, act, ok := strings.Cut(ent, ":")
		if !ok || name == "" {
			return fmt.Errorf("%q: want name:action", ent)
		}
		p := &point{}
		if a, n, ok := strings.Cut(act, "@"); ok {
			n, p.on = strings.CutSuffix(n, "+")
			at, err := strconv.ParseInt(n, 10, 64)
			if err != nil || at < 1 {
				return fmt.Errorf("%q: @N and @N+ need a positive count", ent)
			}
			act, p.at = a, at
		}
		switch {
		case act == "kill" || act == "panic" || act == "eio" || act == "enospc":
			p.action = act
		case strings.HasPrefix(act, "sleep(") && strings.HasSuffix(act, ")"):
			d, err := time.ParseDuration(act[len("sleep(") : len(act)-1])
			if err != nil || d < 0 {
				return fmt.Errorf("%q: bad sleep duration", ent)
			}
			p.action, p.sleep = "sleep", d
		default:
			return fmt.Errorf("%q: unknown action %q (kill, sleep(D), panic, eio, enospc)", ent, act)
		}
		next[name] = p
	}
	mu.Lock()
	points = next
	mu.Unlock()
	return nil
}

// pollFile applies the file at path whenever its content changes (an empty or
// missing file at first changes nothing). A spec that does not parse is reported and
// leaves the points as they were.
func pollFile(path string, every time.Duration) {
	last := ""
	for ; ; time.Sleep(every) {
		b, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			continue
		}
		spec := strings.TrimSpace(string(b))
		if spec == last {
			continue
		}
		last = spec
		if err := Set(spec); err != nil {
			fmt.Fprintf(os.Stderr, "%s %s: %v\n", FilePrefix, path, err)
			continue
		}
		fmt.Fprintf(os.Stderr, "%s now %q\n", FilePrefix, spec)
	}
}

// Hits returns how often the named point was reached since it was armed (0 when it is
// not armed).
func Hits(name string) int64 {
	if p := armed(name); p != nil {
		return p.hits.Load()
	}
	return 0
}

// Sleeping is how many of the named point's sleeps are under way. A test that must act
// during a stall waits for it rather than for Hits, which counts a hit before its
// fired line is written and its sleep begins.
func Sleeping(name string) int64 {
	if p := armed(name); p != nil {
		return p.sleeping.Load()
	}
	return 0
}

// armed is the named point, or nil when it is not armed.
func armed(name string) *point {
	mu.RLock()
	defer mu.RUnlock()
	return points[name]
}

// ErrInjected is wrapped by every error an armed point returns.
var ErrInjected = errors.New("failpoint: injected")

// Inject acts at the named point when it is armed.
func Inject(name string) { _ = act(name, false, time.Sleep) }

// Err acts at the named point like Inject and returns the injected error of an eio or
// enospc action (wrapping ErrInjected and the errno), or nil.
func Err(name string) error { return act(name, true, time.Sleep) }

// Stall acts at the named point like Inject, but a sleep action sleeps by calling
// sleep: the caller's stand-in for the wait it stands for (a sync that keeps its
// processor sleeps keeping it).
func Stall(name string, sleep func(time.Duration)) { _ = act(name, false, sleep) }

func act(name string, wantErr bool, sleep func(time.Duration)) error {
	p := armed(name)
	if p == nil {
		return nil
	}
	hit := p.hits.Add(1)
	if p.at != 0 && (hit < p.at || hit > p.at && !p.on) {
		return nil
	}
	if (p.action == "eio" || p.action == "enospc") && !wantErr {
		return nil
	}
	// One write(2), unbuffered: the line is out before the process acts.
	fmt.Fprintf(os.Stderr, "%s name=%s action=%s hit=%d unix_nano=%d mono_nano=%d\n", FiredPrefix, name, p.action, hit, time.Now().UnixNano(), monoNanos())
	switch p.action {
	case "kill":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way; never run past the point
	case "panic":
		panic("failpoint " + name)
	case "sleep":
		p.sleeping.Add(1)
		sleep(p.sleep)
		p.sleeping.Add(-1)
	case "eio":
		return fmt.Errorf("%w at %s: %w", ErrInjected, name, syscall.EIO)
	case "enospc":
		return fmt.Errorf("%w at %s: %w", ErrInjected, name, syscall.ENOSPC)
	}
	return nil
}

// monoNanos reads CLOCK_MONOTONIC, the clock Go's own monotonic readings use on Linux.
// Unlike the wall clock it is one clock for every process of the machine and is never
// stepped, so a harness can place the event on its own timeline even when the wall
// clock moved (0 if it cannot be read).
func monoNanos() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
		return 0
	}
	return ts.Nano()
}
