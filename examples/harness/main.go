// Command harness runs the examples against a live node it starts itself and checks that
// each exits 0 and says what it should. `make -C examples test` runs the quick set,
// `make -C examples all` every step.
//
// It builds the Go examples, starts `narad serve` on 127.0.0.1 with a free port and a
// temporary data directory, runs the steps one after another with NARAD_URL pointing at
// it, stops the node (SIGTERM, then SIGKILL after 30 s) and removes what it made. It
// never touches a process it did not start.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	set     string // "test" or "all"
	narad   string
	python  string
	node    string
	only    string
	verbose bool
	keep    bool
	race    bool
}

func main() {
	var o options
	flag.StringVar(&o.set, "set", "test", "test (quick, for make test) or all (every step, for make examples)")
	flag.StringVar(&o.narad, "narad", "", "the narad binary (default: build ../broker)")
	flag.StringVar(&o.python, "python", "../sdk-python/.venv/bin/python", "a Python with the narad SDK installed")
	flag.StringVar(&o.node, "node", "node", "the Node.js binary")
	flag.StringVar(&o.only, "only", "", "run only the steps whose name contains this")
	flag.BoolVar(&o.verbose, "v", false, "print every step's output")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (the node's data and log)")
	flag.BoolVar(&o.race, "race", false, "build the Go examples with the race detector (a race fails its step)")
	flag.Parse()
	if o.set != "test" && o.set != "all" {
		fmt.Fprintln(os.Stderr, "harness: -set is test or all")
		os.Exit(2)
	}
	os.Exit(run(o))
}

// h is one harness run: where things are and how the steps went.
type h struct {
	o       options
	tmp     string // binaries, the node's data and log, the examples' files
	bin     string
	url     string
	failed  []string
	results []string
}

func run(o options) int {
	tmp, err := os.MkdirTemp("", "narad-examples-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, "harness:", err)
		return 1
	}
	if o.keep {
		fmt.Println("harness: keeping", tmp)
	} else {
		defer func() { _ = os.RemoveAll(tmp) }() // a temp dir; the OS cleans it if this fails
	}
	x := &h{o: o, tmp: tmp, bin: filepath.Join(tmp, "bin")}
	if err := x.build(); err != nil {
		fmt.Fprintln(os.Stderr, "harness: build:", err)
		return 1
	}
	stop, err := x.startNode()
	if err != nil {
		fmt.Fprintln(os.Stderr, "harness: start the node:", err)
		return 1
	}
	start := time.Now()
	for _, s := range steps(o.set == "all") {
		if o.set == "test" && !s.quick {
			continue
		}
		if o.only != "" && !strings.Contains(s.name, o.only) {
			continue
		}
		x.runStep(s)
	}
	if err := stop(); err != nil {
		x.failed = append(x.failed, "node: "+err.Error())
	}
	fmt.Printf("\n%s\n", strings.Join(x.results, "\n"))
	if len(x.failed) > 0 {
		fmt.Printf("harness: %d failed: %s\n", len(x.failed), strings.Join(x.failed, ", "))
		return 1
	}
	fmt.Printf("harness: all %d steps passed in %s\n", len(x.results), time.Since(start).Round(100*time.Millisecond))
	return 0
}

// goExamples are the Go programs, by binary name.
var goExamples = map[string]string{
	"workqueue":  "./workqueue/go",
	"dl-worker":  "./deadletter/worker",
	"dlq":        "./deadletter/dlq",
	"retrytiers": "./retrytiers",
	"fanout":     "./fanout",
	"replay":     "./replay",
	"ingest":     "./ingest",
}

func (x *h) build() error {
	t := time.Now()
	for name, pkg := range goExamples {
		args := []string{"build", "-o", filepath.Join(x.bin, name)}
		if x.o.race {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, pkg)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	if x.o.narad == "" {
		x.o.narad = filepath.Join(x.bin, "narad")
		cmd := exec.Command("go", "build", "-o", x.o.narad, "./cmd/narad")
		cmd.Dir = "../broker"
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build narad: %v\n%s", err, out)
		}
	}
	fmt.Printf("harness: built the examples in %s\n", time.Since(t).Round(100*time.Millisecond))
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }() // only held to pick a free port
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startNode starts narad and waits until it is ready; the returned func stops it.
func (x *h) startNode() (func() error, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	logPath := filepath.Join(x.tmp, "narad.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(x.o.narad, "serve", "--http-addr", addr, "--data-dir", filepath.Join(x.tmp, "data"), "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close() // the start error is the one to report
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); _ = logf.Close() }() // the log is only read back to explain a failure
	x.url = "http://" + addr
	stop := func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM) // it may have exited already; exited says how it ended
		select {
		case err := <-exited:
			if err != nil {
				return fmt.Errorf("narad exited with %v (log: %s)", err, tail(readFile(logPath), 20))
			}
			return nil
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill() // it may have exited meanwhile; exited says how it ended
			<-exited
			return errors.New("narad did not stop within 30 s of SIGTERM; killed")
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("narad exited early: %v\n%s", err, tail(readFile(logPath), 20))
		default:
		}
		if r, err := http.Get(x.url + "/readyz"); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				fmt.Printf("harness: node ready at %s (data in %s)\n", x.url, x.tmp)
				return stop, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = stop() // not ready is the error to report; stop's own is secondary
	return nil, errors.New("narad was not ready within 30 s")
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"…"}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// proc is one example process as a step runs it.
type proc struct {
	argv    []string
	timeout time.Duration
	expect  []string // regular expressions the output must match
	// signalAt, when set, sends SIGTERM once the output matches it.
	signalAt string
}

// step is one check: one or more processes run in order, each checked, then an
// optional check over all their outputs.
type step struct {
	name  string
	quick bool // part of the test set
	procs []proc
	check func(outs []string) error
}

func (x *h) runStep(s step) {
	t := time.Now()
	var outs []string
	fail := func(err error, out string) {
		x.failed = append(x.failed, s.name)
		x.results = append(x.results, fmt.Sprintf("FAIL %-28s %6.1fs  %v", s.name, time.Since(t).Seconds(), err))
		fmt.Printf("--- FAIL %s: %v\n%s\n", s.name, err, tail(out, 40))
	}
	fmt.Printf("=== %s\n", s.name)
	for _, p := range s.procs {
		out, err := x.runProc(p)
		if x.o.verbose {
			fmt.Println(out)
		}
		if err != nil {
			fail(fmt.Errorf("%s: %w", strings.Join(p.argv, " "), err), out)
			return
		}
		for _, e := range p.expect {
			if !regexp.MustCompile(e).MatchString(out) {
				fail(fmt.Errorf("%s: output does not match %q", p.argv[0], e), out)
				return
			}
		}
		outs = append(outs, out)
	}
	if s.check != nil {
		if err := s.check(outs); err != nil {
			fail(err, strings.Join(outs, "\n"))
			return
		}
	}
	x.results = append(x.results, fmt.Sprintf("ok   %-28s %6.1fs", s.name, time.Since(t).Seconds()))
}

// resolve turns the first word of argv into a program: a built Go example, python or node.
func (x *h) resolve(argv []string) []string {
	out := append([]string(nil), argv...)
	switch {
	case argv[0] == "python":
		out[0] = x.o.python
	case argv[0] == "node":
		out[0] = x.o.node
	default:
		if _, ok := goExamples[argv[0]]; ok {
			out[0] = filepath.Join(x.bin, argv[0])
		}
	}
	for i := range out {
		out[i] = strings.ReplaceAll(out[i], "{tmp}", x.tmp)
	}
	return out
}

// runProc runs one process to its end and returns its output (stdout and stderr).
func (x *h) runProc(p proc) (string, error) {
	argv := x.resolve(p.argv)
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "NARAD_URL="+x.url)
	cmd.WaitDelay = 5 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var buf bytes.Buffer // written by the reader below until read is closed
	read := make(chan struct{})
	var signalAt *regexp.Regexp
	if p.signalAt != "" {
		signalAt = regexp.MustCompile(p.signalAt)
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	go func() {
		defer close(read)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		sent := false
		for sc.Scan() {
			buf.WriteString(sc.Text() + "\n")
			if signalAt != nil && !sent && signalAt.MatchString(sc.Text()) {
				_ = cmd.Process.Signal(syscall.SIGTERM) // it may have exited already; Wait says how it ended
				sent = true
			}
		}
		_, _ = io.Copy(io.Discard, pr) // drain, so the example never blocks on a full pipe
	}()
	err := cmd.Wait()
	_ = pw.Close() // ends the reader above; the example's own error is err
	<-read
	if ctx.Err() != nil {
		return buf.String(), fmt.Errorf("still running after %s: killed", p.timeout)
	}
	return buf.String(), err
}

// handledSum adds up the "handled N jobs" lines of the outputs.
func handledSum(outs []string) int {
	re := regexp.MustCompile(`(?m)^handled (\d+) jobs`)
	n := 0
	for _, out := range outs {
		for _, m := range re.FindAllStringSubmatch(out, -1) {
			v, _ := strconv.Atoi(m[1])
			n += v
		}
	}
	return n
}

// steps lists every check. full is the `all` set: larger counts, longer delays.
func steps(full bool) []step {
	pick := func(quick, all string) string {
		if full {
			return all
		}
		return quick
	}
	var out []step
	// The work queue, in each language: jobs outlast the lease (renewal), then a run cut
	// by SIGTERM and a second run that finishes the queue (graceful shutdown loses and
	// repeats nothing).
	join := func(parts ...[]string) []string {
		var argv []string
		for _, p := range parts {
			argv = append(argv, p...)
		}
		return argv
	}
	for _, lang := range []struct {
		name         string
		argv         []string
		work         []string // jobs outlast the lease
		stopWork     []string // jobs well inside the lease
		sigtermQuick bool
	}{
		{"go", []string{"workqueue"}, []string{"--work", "2500ms", "--lease", "2s"}, []string{"--work", "1s", "--lease", "4s"}, true},
		{"python", []string{"python", "workqueue/python/worker.py"}, []string{"--work", "2.5", "--lease", "2"}, []string{"--work", "1", "--lease", "4"}, false},
		{"ts", []string{"node", "workqueue/ts/dist/worker.js"}, []string{"--work-ms", "2500", "--lease-ms", "2000"}, []string{"--work-ms", "1000", "--lease-ms", "4000"}, false},
	} {
		jobs := pick("8", "16")
		args := join(lang.argv, []string{"--topic", "jobs-" + lang.name, "--jobs", jobs, "--workers", "4", "--exit-when-empty"}, lang.work)
		out = append(out, step{
			name: "workqueue/" + lang.name, quick: true,
			procs: []proc{{argv: args, timeout: 2 * time.Minute, expect: []string{`enqueued ` + jobs + ` jobs`}}},
			check: func(outs []string) error {
				// Every job was handled, and leases were renewed. On a machine loaded enough to
				// delay a renewal past the lease, a job may be handled twice: at least once is
				// the contract, so more than the jobs is not a failure here.
				m := regexp.MustCompile(`(?m)^handled (\d+) jobs \(lease renewals (\d+)`).FindStringSubmatch(outs[0])
				if m == nil {
					return errors.New("no \"handled N jobs (lease renewals M\" line")
				}
				handled, _ := strconv.Atoi(m[1])
				renewals, _ := strconv.Atoi(m[2])
				want, _ := strconv.Atoi(jobs)
				if handled < want || renewals == 0 {
					return fmt.Errorf("handled %d jobs with %d lease renewals, want %d jobs and some renewals", handled, renewals, want)
				}
				return nil
			},
		})
		stopTopic := "jobs-stop-" + lang.name
		first := join(lang.argv, []string{"--topic", stopTopic, "--jobs", "12", "--workers", "2"}, lang.stopWork)
		second := join(lang.argv, []string{"--topic", stopTopic, "--workers", "4", "--exit-when-empty"}, lang.stopWork)
		out = append(out, step{
			name: "workqueue/" + lang.name + "/sigterm", quick: lang.sigtermQuick,
			procs: []proc{
				{argv: first, timeout: 2 * time.Minute, signalAt: `\[2 handled\]`, expect: []string{`signal received: drained`}},
				{argv: second, timeout: 2 * time.Minute, expect: []string{`queue empty: stopping`}},
			},
			check: func(outs []string) error {
				if n := handledSum(outs); n != 12 {
					return fmt.Errorf("the two runs handled %d jobs between them, want exactly 12", n)
				}
				return nil
			},
		})
	}

	out = append(out,
		step{
			name: "deadletter", quick: true,
			procs: []proc{
				{argv: []string{"dl-worker", "--topic", "payments", "--produce", "20", "--exit-when-empty"}, timeout: time.Minute,
					expect: []string{`succeeded 16, retried 13, parked 4`, `payment 5 parked in payments-dlq after 3 attempts`}},
				{argv: []string{"dlq", "inspect", "--topic", "payments-dlq"}, timeout: time.Minute,
					expect: []string{`4 parked messages in the log, 4 waiting to be re-driven`, `4 × processor rejected`}},
				{argv: []string{"dlq", "redrive", "--topic", "payments-dlq"}, timeout: time.Minute,
					expect: []string{`re-drove 4 messages from payments-dlq`}},
				{argv: []string{"dl-worker", "--topic", "payments", "--fixed", "--exit-when-empty"}, timeout: time.Minute,
					expect: []string{`succeeded 4, retried 1, parked 0`}},
				{argv: []string{"dlq", "inspect", "--topic", "payments-dlq"}, timeout: time.Minute,
					expect: []string{`4 parked messages in the log, 0 waiting`}},
			},
		},
		step{
			name: "retrytiers", quick: true,
			procs: []proc{{argv: []string{"retrytiers", "--topic", "emails", "--delays", pick("300ms,600ms,900ms", "1s,2s,3s")},
				timeout: 2 * time.Minute, expect: []string{
					`email 4: sent on attempt 4`, `email 5: parked after 4 attempts`,
					`in emails-dlq: email 5, 4 attempts`, `all 5 emails finished .*every retry waited its tiers' delays`,
				}}},
		},
		step{
			name: "fanout", quick: true,
			procs: []proc{{argv: []string{"fanout", "--topic", "orders", "--orders", pick("20", "100"), "--reminder-delay", pick("1s", "3s")},
				timeout: 2 * time.Minute, expect: []string{
					`billing: charged ` + pick("20", "100") + ` orders`, `reminders: ` + pick("20", "100") + ` sent, none earlier than`,
				}}},
		},
		step{
			name: "replay", quick: true,
			procs: []proc{
				{argv: []string{"replay", "--topic", "ledger", "--events", pick("1000", "20000"), "--checkpoint", "{tmp}/ledger.checkpoint.json"}, timeout: time.Minute,
					expect: []string{`no checkpoint at .*: rebuilding from offset 0`, `read model matches the full rebuild: \d+ accounts, ` + pick("1000", "20000") + ` events`}},
				{argv: []string{"replay", "--topic", "ledger", "--events", "200", "--checkpoint", "{tmp}/ledger.checkpoint.json"}, timeout: time.Minute,
					expect: []string{`resuming from checkpoint`, `caught up: applied 200 events`, `read model matches the full rebuild`}},
			},
		},
		step{
			name: "ingest", quick: true,
			procs: []proc{{argv: []string{"ingest", "--topic", "ingest", "--lines", pick("20000", "200000")}, timeout: 3 * time.Minute,
				expect: []string{`published ` + pick("20000", "200000") + ` lines .* lines/s, .*; 0 failed`}}},
		},
		step{
			name: "dedup", quick: true,
			procs: []proc{{argv: []string{"python", "dedup/dedup.py", "--topic", "deposits", "--messages", pick("30", "200"), "--db", "{tmp}/dedup.db"},
				timeout: 2 * time.Minute, expect: []string{` applied, \d+ duplicates skipped`, `balance \d+ cents, expected \d+: correct`}}},
		},
	)
	return out
}
