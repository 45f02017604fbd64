package workload

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/narad-mq/narad/verify/history"
	"github.com/narad-mq/narad/verify/node"
)

// FaultConfig says which faults hit the node and how often.
type FaultConfig struct {
	// Kills is the least number of kills (kill -9 and failpoint kills) before the fault
	// phase may end; it also goes on while producers run, and for Duration.
	Kills int
	// FailpointShare of the restarts arm a failpoint that kills the node (0.5: half).
	FailpointShare float64
	// MinFailpointKills is the least number of kills that must happen at failpoints;
	// restarts arm one whenever the plain kills would otherwise use up Kills first.
	MinFailpointKills int
	// Pauses mixes in SIGSTOP/SIGCONT of up to twice the lease.
	Pauses bool
	// Corrupt damages a stopped node's files: it appends torn tails (zeros, garbage,
	// half a frame) to active segments and settle journals, flips a bit in a record of an
	// active segment or of a settle journal that has a record after it (acknowledged
	// data: the node must skip the damaged message, or deliver a damaged settle's
	// messages again, and report it), and cuts a settle journal back below the position
	// its checkpoint covers (a checkpoint ahead of its journal: nothing may change).
	Corrupt bool
	// Disk arms injected EIO and ENOSPC at segment-after-write and slow syncs at
	// wal-sync (see diskPoint).
	Disk bool
	// MinGap and MaxGap bound the time between two faults.
	MinGap, MaxGap time.Duration
	// Duration keeps faults coming at least this long.
	Duration time.Duration
	// ClockShare of the restarts step the node's wall clock (NARAD_CLOCK_OFFSET, read by
	// a failpoints build): backward and forward in turn, by 1 s, 10 s or 1 h, on top of
	// the offset the node ran with before, staying within ±1 h. The drain's node runs
	// with the highest offset any node had, so every delayed copy comes due.
	ClockShare float64
	// MinClockSteps: every third restart steps the clock until this many steps happened.
	MinClockSteps int
	// Env is extra environment for every start (besides NARAD_FAILPOINTS).
	Env []string
}

// ClockEnvVar shifts the wall clock a failpoints build of narad reads at start (it
// mirrors broker/internal/failpoint.ClockEnvVar).
const ClockEnvVar = "NARAD_CLOCK_OFFSET"

// ClockDriftEnvVar makes the wall clock of a failpoints build drift: it gains that many
// seconds a second (it mirrors broker/internal/failpoint.ClockDriftEnvVar).
const ClockDriftEnvVar = "NARAD_CLOCK_DRIFT"

type injector struct {
	w     *run
	cfg   FaultConfig
	rng   *rand.Rand
	start time.Time

	mode    string // what the current incarnation was armed with: "", "kill", "ckpt", "disk"
	point   string
	action  string
	kills   int
	fpKills int

	clockCur   time.Duration // the running node's wall-clock offset (NARAD_CLOCK_OFFSET)
	clockHigh  time.Duration // the highest offset any node ran with
	clockSteps int
	restarts   int
	// drift is the machine's wall clock against the run's monotonic clock as last
	// recorded; wallDrift measures it now (Clock.WallDrift; tests replace it).
	drift      time.Duration
	driftMoved time.Duration // the last move measureDrift kept
	wallDrift  func() time.Duration
}

type armSpec struct {
	point  string
	lo, hi int
	weight int
}

func (in *injector) killPoints() []armSpec {
	ps := []armSpec{
		{"segment-after-write", 5, 150, 3},
		{"segment-after-fsync", 5, 150, 2},
		{"partition-after-append", 5, 100, 3},
		{"partition-after-settle", 5, 150, 3},
		{"segment-roll-created", 1, 3, 2},
		{"partition-before-rename-epoch", 1, 9, 1},
		{"partition-before-rename-queue.ckpt", 1, 9, 2}, // armed, then a graceful stop
	}
	if in.w.cfg.RetentionMs > 0 {
		ps = append(ps, armSpec{"segment-retention-delete", 1, 3, 1}, armSpec{"segment-retention-unlink", 1, 4, 1})
	}
	return ps
}

func (in *injector) pick() armSpec {
	ps := in.killPoints()
	total := 0
	for _, p := range ps {
		total += p.weight
	}
	x := in.rng.Intn(total)
	for _, p := range ps {
		if x < p.weight {
			return p
		}
		x -= p.weight
	}
	return ps[0]
}

func (in *injector) now() int64 { return in.w.clk.Now() }

func (in *injector) fault(kind string, start, end int64, target, detail string) {
	in.w.rec.Add(history.Entry{Kind: history.KindFault, Fault: kind, Call: start, Return: end, Target: target, Detail: detail, Partition: -1, Offset: -1})
	in.w.mu.Lock()
	in.w.stats.Faults[kind]++
	if kind == history.FaultFailpointKill {
		in.w.stats.Failpoints[target]++
	}
	in.w.mu.Unlock()
}

func (in *injector) note(format string, args ...any) {
	in.w.mu.Lock()
	in.w.stats.Notes = append(in.w.stats.Notes, fmt.Sprintf(format, args...))
	in.w.mu.Unlock()
}

func (in *injector) sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func (in *injector) gap() time.Duration {
	lo, hi := in.cfg.MinGap, in.cfg.MaxGap
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(in.rng.Int63n(int64(hi-lo)))
}

func (in *injector) done() bool {
	return in.kills >= in.cfg.Kills && in.fpKills >= in.cfg.MinFailpointKills && in.w.prodDone.Load() && time.Since(in.start) >= in.cfg.Duration
}

// run injects faults until done; the node runs unarmed when it returns (or it failed).
func (in *injector) run(ctx context.Context) error {
	in.start = time.Now()
	if in.cfg.Kills == 0 && !in.cfg.Pauses {
		for !in.done() && in.sleep(ctx, 100*time.Millisecond) {
		}
		return ctx.Err()
	}
	for ctx.Err() == nil && !in.done() {
		gap := in.gap()
		switch in.mode {
		case "kill":
			in.awaitSelfKill(ctx, max(3*gap, 4*time.Second))
		case "ckpt":
			if !in.sleep(ctx, gap) {
				return ctx.Err()
			}
			in.gracefulStop()
		case "disk":
			in.awaitDisk(ctx, max(3*gap, 4*time.Second))
		default:
			exited := in.w.n.Exited()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-exited:
				in.crashed()
			case <-time.After(gap):
				if in.cfg.Pauses && in.rng.Intn(100) < 20 {
					in.pause(ctx)
					continue
				}
				in.kill("")
			}
		}
		if in.cfg.Corrupt && in.rng.Intn(100) < 35 {
			in.corrupt()
		}
		if err := in.restart(ctx, true); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// crashed records a node that died with nothing armed: a broker crash.
func (in *injector) crashed() {
	t := in.now()
	in.fault(history.FaultCrash, t, t, "node", "exited by itself: "+in.w.n.ExitState())
	in.note("the node exited by itself (%s); see its log", in.w.n.ExitState())
	in.kills++
}

func (in *injector) kill(detail string) {
	t0 := in.now()
	_ = in.w.n.Kill() // a node that has exited already is as good as killed
	in.fault(history.FaultKill, t0, in.now(), "node", detail)
	in.kills++
}

func (in *injector) pause(ctx context.Context) {
	vis := time.Duration(in.w.cfg.VisibilityMs) * time.Millisecond
	d := 100*time.Millisecond + time.Duration(in.rng.Int63n(int64(2*vis)))
	t0 := in.now()
	if err := in.w.n.Pause(); err != nil {
		return
	}
	in.sleep(context.Background(), d) // always resume, even when cancelled
	_ = in.w.n.Resume()               // if it cannot be resumed, the next fault or the final stop kills it
	in.fault(history.FaultPause, t0, in.now(), "node", d.String())
}

// recordFired turns the failpoint lines of the last incarnation into fault entries; it
// returns whether one of them was a kill.
func (in *injector) recordFired(end int64) bool {
	killed := false
	for _, f := range in.w.n.TakeFired() {
		start := firedAt(in.w.clk, f, end)
		switch f.Action {
		case "kill":
			in.fault(history.FaultFailpointKill, start, end, f.Name, "")
			in.kills++
			in.fpKills++
			killed = true
		case "sleep":
			in.fault(history.FaultDisk, start, start+int64(1500*time.Millisecond), f.Name, "slow fsync 1.5s")
		default:
			in.fault(history.FaultDisk, start, end, f.Name, f.Action)
		}
	}
	return killed
}

// firedAt places a failpoint's action on the run's clock: by the node's monotonic
// reading, which the wall clock's steps and slews do not move (a wall reading put a
// kill 10 s after it was seen, on a machine whose wall clock jumped). It is never later
// than end, when the harness saw the outcome.
func firedAt(clk *history.Clock, f node.Fired, end int64) int64 {
	t, ok := clk.FromMono(f.MonoNano)
	if !ok {
		t = clk.FromWall(f.UnixNano)
	}
	return min(t, end)
}

func (in *injector) awaitSelfKill(ctx context.Context, limit time.Duration) {
	select {
	case <-in.w.n.Exited():
		if !in.recordFired(in.now()) {
			in.crashed()
		}
	case <-time.After(limit):
		in.kill("armed " + in.point + " was not reached")
		in.recordFired(in.now())
	case <-ctx.Done():
		in.kill("")
	}
}

func (in *injector) gracefulStop() {
	t0 := in.now()
	err := in.w.n.Stop(30 * time.Second)
	if !in.recordFired(in.now()) {
		detail := "graceful stop; the armed checkpoint failpoint was not reached"
		if err != nil {
			detail = err.Error()
			in.note("graceful stop: %v", err)
		}
		// A graceful stop ends leases like a kill does.
		in.fault(history.FaultKill, t0, in.now(), "node", detail)
		in.kills++
	}
}

// diskPoint is where a disk fault of the action is armed: an error at a segment's
// write (segment-after-write, which stands for its failed fsync); a slow sync in the
// write-ahead file's sync (wal-sync), where the node's syncs are, and which stalls as
// the sync would, keeping the writer's processor when it holds it (a collection
// meanwhile stops the node for the stall, and its peers may count it dead).
func diskPoint(action string) string {
	if strings.HasPrefix(action, "sleep(") {
		return "wal-sync"
	}
	return "segment-after-write"
}

// sleepOf is the duration of a sleep(D) action.
func sleepOf(action string) (time.Duration, bool) {
	s, ok := strings.CutPrefix(action, "sleep(")
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(strings.TrimSuffix(s, ")"))
	return d, err == nil
}

func (in *injector) awaitDisk(ctx context.Context, limit time.Duration) {
	deadline := time.After(limit)
	for {
		select {
		case <-ctx.Done():
			in.kill("")
			return
		case <-deadline:
			in.kill("armed disk fault " + in.point + " was not reached")
			in.recordFired(in.now())
			return
		case <-in.w.n.Exited():
			in.recordFired(in.now())
			in.crashed()
			return
		case <-time.After(50 * time.Millisecond):
		}
		if in.w.n.FiredCount() > 0 {
			// Let the failed partition answer for a while, then restart it: a failed log
			// stays closed until it is reopened. A stall is let end first, so that the
			// node answers after it (killed in it, it was a kill in a sync).
			wait := 300*time.Millisecond + time.Duration(in.rng.Int63n(int64(time.Second)))
			if d, ok := sleepOf(in.action); ok {
				wait += d
			}
			in.sleep(ctx, wait)
			in.kill("after " + in.action)
			in.recordFired(in.now())
			return
		}
	}
}

// maxClockOffset bounds the offset: the node's clock is never more than this off the
// machine's (RELIABILITY 25: jumps of ±1 h).
const maxClockOffset = time.Hour

// clockStep picks the next step of the wall clock: backward first, then forward, in
// turn, by 1 s, 10 s or 1 h, the other way when the offset would leave ±1 h.
func (in *injector) clockStep() time.Duration {
	mags := []time.Duration{time.Second, 10 * time.Second, 10 * time.Second, time.Hour}
	m := mags[in.rng.Intn(len(mags))]
	in.clockSteps++
	if in.clockSteps%2 == 1 {
		m = -m
	}
	if d := in.clockCur + m; d > maxClockOffset || d < -maxClockOffset {
		m = -m
	}
	return m
}

// driftStep is how far the machine's wall clock must move against the monotonic clock
// before a start records it: less is within the checker's tolerances.
const driftStep = 50 * time.Millisecond

// clock decides the wall-clock offset of the next start and records a step as a clock
// fault. Without mayArm (the drain) the node gets the highest offset so far. A clock
// line carries the offset the node will really run with: the step's plus however far
// the machine's own wall clock has moved since the run began, so the checker excuses
// early delays and retention after a machine's forward jump as after one of ours.
func (in *injector) clock(mayArm bool) time.Duration {
	moved := in.measureDrift()
	off := in.clockCur
	switch {
	case !mayArm:
		off = in.clockHigh
	case in.cfg.ClockShare > 0:
		in.restarts++
		if in.rng.Float64() < in.cfg.ClockShare || in.clockSteps < in.cfg.MinClockSteps && in.restarts%3 == 0 {
			off += in.clockStep()
		}
	}
	if off != in.clockCur {
		t := in.now()
		detail := fmt.Sprintf("step %s, offset %s", fmtStep(off-in.clockCur), fmtStep(off))
		if moved {
			detail += ", " + in.driftDetail()
		}
		in.w.rec.Add(history.Entry{Kind: history.KindFault, Fault: history.FaultClock, Call: t, Return: t, Target: "node",
			Detail: detail, ClockOffset: int64(off + in.drift), Partition: -1, Offset: -1})
		in.w.mu.Lock()
		in.w.stats.Faults[history.FaultClock]++
		in.w.mu.Unlock()
		in.clockCur = off
		in.clockHigh = max(in.clockHigh, off)
	} else if moved {
		// Not a fault of ours, so not counted as one; the checker needs the line all the same.
		t := in.now()
		in.w.rec.Add(history.Entry{Kind: history.KindFault, Fault: history.FaultClock, Call: t, Return: t, Target: "node",
			Detail: in.driftDetail() + ", offset " + fmtStep(off), ClockOffset: int64(off + in.drift), Partition: -1, Offset: -1})
	}
	return off
}

// measureDrift reads how far the machine's wall clock has moved against the monotonic
// clock since the start (the node about to start reads that wall clock) and reports
// whether it moved by driftStep or more since the last reading it kept.
func (in *injector) measureDrift() bool {
	measure := in.wallDrift
	if measure == nil {
		measure = in.w.clk.WallDrift
	}
	d := measure()
	if diff := d - in.drift; diff > -driftStep && diff < driftStep {
		return false
	}
	in.driftMoved, in.drift = d-in.drift, d
	return true
}

func (in *injector) driftDetail() string {
	return fmt.Sprintf("the machine's wall clock moved %s against the monotonic clock (%s since the start)",
		fmtStep(in.driftMoved), fmtStep(in.drift))
}

func fmtStep(d time.Duration) string {
	if d > 0 {
		return "+" + d.String()
	}
	return d.String()
}

// restart starts the node again, armed or not, and waits until it is ready. A
// failpoint that kills it during start-up is recorded and the node started again.
func (in *injector) restart(ctx context.Context, mayArm bool) error {
	in.recordSkips()
	off := in.clock(mayArm)
	for try := 0; ; try++ {
		env := append([]string(nil), in.cfg.Env...)
		if off != 0 {
			env = append(env, ClockEnvVar+"="+off.String())
		}
		in.mode, in.point, in.action = "", "", ""
		if mayArm && try < 3 {
			x := in.rng.Float64()
			if need := in.cfg.MinFailpointKills - in.fpKills; need > 0 && in.cfg.Kills-in.kills <= need {
				x = 0 // the plain kills are used up: arm a kill
			}
			switch {
			case x < in.cfg.FailpointShare:
				p := in.pick()
				in.point = p.point
				at := p.lo + in.rng.Intn(p.hi-p.lo+1)
				in.mode, in.action = "kill", "kill"
				if p.point == "partition-before-rename-queue.ckpt" {
					in.mode = "ckpt"
				}
				env = append(env, fmt.Sprintf("NARAD_FAILPOINTS=%s:kill@%d", p.point, at))
			case in.cfg.Disk && x < in.cfg.FailpointShare+0.2:
				in.mode = "disk"
				in.action = []string{"eio", "enospc", "sleep(1500ms)"}[in.rng.Intn(3)]
				in.point = diskPoint(in.action)
				env = append(env, fmt.Sprintf("NARAD_FAILPOINTS=%s:%s@%d", in.point, in.action, 5+in.rng.Intn(300)))
			}
		}
		t0 := in.now()
		if err := in.w.n.Start(env...); err != nil {
			return err
		}
		err := in.w.n.WaitReady(60 * time.Second)
		if err == nil {
			in.fault(history.FaultRestart, t0, in.now(), "node", strings.Join(env, " "))
			return nil
		}
		if in.w.n.Running() {
			_ = in.w.n.Kill() // the restart error is the one to report
			return fmt.Errorf("restart: %w", err)
		}
		<-in.w.n.Exited()
		if !in.recordFired(in.now()) {
			return fmt.Errorf("restart: %w", err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// ensureUp leaves the node running and unarmed (for the drain), with the highest clock
// offset so far.
func (in *injector) ensureUp(ctx context.Context, mayArm bool) error {
	if in.w.n.Running() && in.mode == "" && in.clockCur >= in.clockHigh {
		return nil
	}
	if in.w.n.Running() {
		in.kill("end of the fault phase")
	}
	in.recordFired(in.now())
	return in.restart(ctx, mayArm)
}

// tornTail appends what a crash can leave after the last synced record of an active
// segment or settle journal: zeros (the size was durable, the data not), garbage, or
// the start of a frame. Recovery must cut exactly that and nothing 202'd.
func (in *injector) tornTail() {
	var logs []string
	_ = filepath.WalkDir(filepath.Join(in.w.n.DataDir(), "topics"), func(p string, d os.DirEntry, err error) error { // always nil: the callback skips what it cannot read
		if err == nil && d.IsDir() && (d.Name() == "log" || d.Name() == "journal") {
			logs = append(logs, p)
		}
		return nil
	})
	if len(logs) == 0 {
		return
	}
	sort.Strings(logs)
	path := activeSegment(logs[in.rng.Intn(len(logs))])
	if path == "" {
		return
	}
	kind, tail := tornBytes(in.rng)
	t0 := in.now()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return
	}
	_, err = f.Write(tail)
	_ = f.Close() // a torn tail is meant to be unsynced; the write error decides
	if err != nil {
		return
	}
	rel, _ := filepath.Rel(in.w.n.DataDir(), path)
	in.fault(history.FaultCorrupt, t0, in.now(), rel, fmt.Sprintf("torn tail: %d bytes of %s", len(tail), kind))
}

// corrupt damages the stopped node's files in one of the ways FaultConfig.Corrupt lists.
func (in *injector) corrupt() {
	switch in.rng.Intn(5) {
	case 0:
		if in.flipRecord("log") {
			return
		}
	case 1:
		if in.flipRecord("journal") {
			return
		}
	case 2:
		if in.checkpointAhead() {
			return
		}
	}
	in.tornTail()
}

// partitionLogs lists the log/ or journal/ directories of every partition, sorted.
func (in *injector) partitionLogs(name string) []string {
	var logs []string
	_ = filepath.WalkDir(filepath.Join(in.w.n.DataDir(), "topics"), func(p string, d os.DirEntry, err error) error { // always nil: the callback skips what it cannot read
		if err == nil && d.IsDir() && d.Name() == name {
			logs = append(logs, p)
		}
		return nil
	})
	sort.Strings(logs)
	return logs
}

// activeSegment returns the path of the last segment file of a log directory.
func activeSegment(dir string) string { return newestFile(dir, ".log") }

// tornBytes draws what a torn write leaves after a file's last whole record: zeros,
// garbage, or a frame header promising more bytes than follow.
func tornBytes(rng *rand.Rand) (kind string, tail []byte) {
	switch rng.Intn(3) {
	case 0:
		return "zeros", make([]byte, 1+rng.Intn(4096))
	case 1:
		tail = make([]byte, 1+rng.Intn(100))
		rng.Read(tail)
		return "garbage", tail
	default:
		return "half-frame", []byte{200, 0, 0, 0, 1, 2, 3, 4, 1, 0, 0, 0}
	}
}

// Frame is one record of a segment file, read with the layout of the segment README.
type Frame struct {
	Pos, Size int
	Offset    uint64
	Value     []byte
}

// Frames parses the whole frames at the start of a segment file's bytes.
func Frames(b []byte) []Frame {
	var out []Frame
	for pos := 0; pos+36 <= len(b); {
		n := int(binary.LittleEndian.Uint32(b[pos:])) + 4
		if n < 36 || pos+n > len(b) {
			break
		}
		f := b[pos : pos+n]
		k := int(binary.LittleEndian.Uint32(f[28:]))
		if 36+k > n {
			break
		}
		out = append(out, Frame{Pos: pos, Size: n, Offset: binary.LittleEndian.Uint64(f[12:]), Value: f[36+k:]})
		pos += n
	}
	return out
}

// partitionOf reads topic, incarnation and partition from a log directory's path
// (…/topics/<incarnation>-<topic>/<partition>/log).
func partitionOf(dir string) (topic string, inc int64, part int32, ok bool) {
	pdir := filepath.Dir(dir)
	p, err := strconv.ParseInt(filepath.Base(pdir), 10, 32)
	if err != nil {
		return "", 0, 0, false
	}
	incStr, name, found := strings.Cut(filepath.Base(filepath.Dir(pdir)), "-")
	i, err := strconv.ParseInt(incStr, 10, 64)
	if !found || err != nil {
		return "", 0, 0, false
	}
	return name, i, int32(p), true
}

// DecodeSettles reads a settle record's value: a uvarint count, then zig-zag varint
// deltas of the offsets.
func DecodeSettles(v []byte) []int64 {
	n, k := binary.Uvarint(v)
	if k <= 0 || n > uint64(len(v)) {
		return nil
	}
	v = v[k:]
	var out []int64
	prev := int64(0)
	for i := uint64(0); i < n; i++ {
		d, k := binary.Varint(v)
		if k <= 0 {
			return nil
		}
		v = v[k:]
		prev += d
		out = append(out, prev)
	}
	return out
}

// flipRecord flips one bit inside a record of the active segment of a random log/ or
// journal/ directory, never its last record: with a valid record after it, the damaged
// one was acknowledged, and the node must treat it as damage (the last records since the
// node's last recovery point could pass for a torn write, which the contract allows to
// be cut). It records which messages the damage concerns.
func (in *injector) flipRecord(kind string) bool {
	logs := in.partitionLogs(kind)
	if len(logs) == 0 {
		return false
	}
	dir := logs[in.rng.Intn(len(logs))]
	topic, inc, part, ok := partitionOf(dir)
	path := activeSegment(dir)
	if !ok || path == "" {
		return false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	fs := Frames(b)
	if len(fs) < 2 {
		return false
	}
	f := fs[in.rng.Intn(len(fs)-1)]
	var offsets []int64
	if kind == "log" {
		offsets = []int64{int64(f.Offset)}
	} else if offsets = DecodeSettles(f.Value); len(offsets) == 0 {
		return false
	}
	ids := messageIDs(filepath.Join(filepath.Dir(dir), "log"), offsets)
	// A bit of the part the CRC covers (after the length and CRC fields).
	at := f.Pos + 8 + in.rng.Intn(f.Size-8)
	bit := byte(1) << in.rng.Intn(8)
	t0 := in.now()
	fh, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return false
	}
	_, err = fh.WriteAt([]byte{b[at] ^ bit}, int64(at))
	_ = fh.Close() // a flipped bit is meant to be unsynced; the write error decides
	if err != nil {
		return false
	}
	rel, _ := filepath.Rel(in.w.n.DataDir(), path)
	end := in.now()
	in.fault(history.FaultCorrupt, t0, end, rel, fmt.Sprintf("bit flip in %s record %d (byte %d of the file)", kind, f.Offset, at))
	for _, o := range offsets {
		in.w.rec.Add(history.Entry{Kind: history.KindFault, Fault: history.FaultDamaged, Call: t0, Return: end, Target: kind,
			Topic: topic, Incarnation: inc, Partition: part, Offset: o, Msg: ids[o], Detail: rel})
	}
	return true
}

// messageIDs reads the message ids (the payload's "id") at offsets from a partition's
// log directory, before any damage is done.
func messageIDs(dir string, offsets []int64) map[int64]string {
	want := map[int64]bool{}
	for _, o := range offsets {
		want[o] = true
	}
	out := map[int64]string{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		for _, f := range Frames(b) {
			if want[int64(f.Offset)] {
				var p payload
				if json.Unmarshal(f.Value, &p) == nil {
					out[int64(f.Offset)] = p.ID
				}
			}
		}
	}
	return out
}

// checkpointAhead cuts the last records off a settle journal whose records all lie
// below the position its partition's checkpoint covers (as after a clean stop), and
// removes the journal's recovery point: a journal that comes back shorter than its
// checkpoint. The checkpoint holds those settles, so the contract must hold unchanged,
// and settles after the restart must survive the next one.
func (in *injector) checkpointAhead() bool {
	for _, dir := range in.partitionLogs("journal") {
		ck, err := os.ReadFile(filepath.Join(filepath.Dir(dir), "queue.ckpt"))
		if err != nil || len(ck) < 21 || string(ck[:4]) != "NQCK" {
			continue
		}
		covered := binary.BigEndian.Uint64(ck[13:])
		path := activeSegment(dir)
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		fs := Frames(b)
		if len(fs) == 0 || fs[len(fs)-1].Offset+1 != covered || fs[len(fs)-1].Pos+fs[len(fs)-1].Size != len(b) {
			continue // settles past the checkpoint: cutting them would lose acks
		}
		keep := fs[in.rng.Intn(len(fs))].Pos
		t0 := in.now()
		if err := os.Truncate(path, int64(keep)); err != nil {
			continue
		}
		_ = os.Remove(filepath.Join(dir, "recovery-point")) // may not exist; without it the log is scanned from the start
		rel, _ := filepath.Rel(in.w.n.DataDir(), path)
		in.fault(history.FaultCorrupt, t0, in.now(), rel, fmt.Sprintf("checkpoint ahead of its journal: journal cut from %d to %d bytes, the checkpoint covers up to %d", len(b), keep, covered))
		return true
	}
	return false
}

// recordSkips turns the node's reports of skipped damaged records into history entries.
func (in *injector) recordSkips() {
	t := in.now()
	for _, s := range in.w.n.TakeSkips() {
		in.w.rec.Add(history.Entry{Kind: history.KindFault, Fault: history.FaultSkipped, Call: t, Return: t, Target: s.Log,
			Topic: s.Topic, Partition: s.Partition, Offset: s.Offset, Detail: s.Child})
	}
}
