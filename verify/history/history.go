// Package history is the record a verification run keeps: one JSON line per HTTP
// attempt, per fault and per stats sample, all timed on one monotonic clock (nanoseconds
// since the run started). The checker reads nothing else, so a saved history can be
// checked again, and a doctored one shows that the checker can fail.
package history

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Kinds of entries.
const (
	KindRun   = "run"   // the first line: seed and settings
	KindOp    = "op"    // one HTTP attempt (a batch answer adds one line per item)
	KindFault = "fault" // one injected fault
	KindStats = "stats" // one partition's markers, read from GET /v1/topics/{t}
	KindPhase = "phase" // a phase of the run began (faults, drain, done)
	// KindIntent is written before a produce is sent (Msg, or IDs for a batch; Client,
	// Topic, Attempt): a run that dies before the answer's line still shows the attempt,
	// which the checker then counts as sent without an answer.
	KindIntent = "intent"
)

// Operations.
const (
	OpProduce = "produce"
	OpConsume = "consume" // one line per delivered message; Status 204 with no message
	OpAck     = "ack"     // settle
	OpNack    = "nack"    // extend=0: hand back now
	OpExtend  = "extend"  // extend=true: renew the lease
	OpAdmin   = "admin"   // create topic, attach child, ...
	OpRead    = "read"    // replay (GET .../partitions/{p}/messages): one line per message returned; Status 200 with no message for none
	// OpCreateTopic and OpDeleteTopic are the creates and deletes of a topic the workload
	// deletes and recreates under load (TopicInfo.Recreated); a 201 records the
	// incarnation the broker reports.
	OpCreateTopic = "create-topic"
	OpDeleteTopic = "delete-topic"
)

// Faults.
const (
	FaultKill          = "kill"           // kill -9 from the harness
	FaultFailpointKill = "failpoint-kill" // the node killed itself at a failpoint
	FaultPause         = "pause"          // SIGSTOP … SIGCONT
	FaultCorrupt       = "corrupt"        // bytes edited in a stopped node's files
	FaultDisk          = "disk"           // an injected EIO/ENOSPC or a slow fsync
	FaultRestart       = "restart"        // a node start; End is when it was ready
	FaultStop          = "stop"           // a graceful stop (SIGTERM) of a rolling restart; End is when it exited
	FaultCrash         = "crash"          // the node exited with nothing armed: a broker bug
	// FaultDamaged: the harness damaged one stored record of a stopped node (a FaultCorrupt
	// says how). Target "log": the message at Topic/Partition/Offset (Incarnation: its
	// topic's incarnation, from the directory name); Target "journal": a settle record
	// that settled the message at Topic/Partition/Offset (one entry per message).
	FaultDamaged = "damaged"
	// FaultSkipped: the node reported skipping a damaged record (its ERROR log line).
	// Target "log": the message at Topic/Partition/Offset, settled without delivery;
	// Target "journal": a settle record of Topic/Partition lost on start (Offset -1);
	// Target "fanout": the parent message at Topic/Partition/Offset never copied into the
	// child named in Detail.
	FaultSkipped = "skipped"
	// FaultClock: the node restarts with its wall clock stepped (NARAD_CLOCK_OFFSET).
	// ClockOffset is the offset every node start from Call on runs with, until the next
	// clock entry; Detail names the step. Before the first one the offset is zero.
	FaultClock = "clock"
	// FaultWipe: a stopped cluster node's data directory was deleted (Target: the node).
	FaultWipe = "wipe"
	// FaultNet: a cluster node's node plane was cut or degraded (chaosnet rules; Target:
	// the node or nodes, comma-separated; Detail: the rules). The window reaches to when
	// the rules were lifted and the nodes read that.
	FaultNet = "net"
	// FaultMove: a partition replica moved from one node to another under load (POST
	// /v1/cluster/moves; Target: the node that got it, Detail: the move and how it
	// ended). It excuses nothing: a move is planned, and the leader changes it makes
	// show in the epochs as any other does.
	FaultMove = "move"
)

// KindReplica is a line written after a cluster run stopped: one node's replica of one
// partition as its segment files hold it (Node, Topic, Partition; Offset: the first
// offset held; IDs: the message id at each offset from there; Detail: a digest of every
// record's bytes, which must be the same on every replica). KindQuiesce says whether the
// nodes came to agree before they were stopped (Detail "ok", or what still differed).
const (
	KindReplica = "replica"
	KindQuiesce = "quiesce"
)

// KindLeader is a line written after a cluster run stopped: a partition leadership a
// node logged taking (Node, Topic, Incarnation, Partition; Epoch: the term; Detail:
// "handover", a planned change whose new leader honours the live leases, or
// "election", after which the old leader's handles are void). Call and Return are when
// the harness wrote it, not when the node took over: the checker goes by terms.
const KindLeader = "leader"

// Entry is one line. Unused fields are left out.
type Entry struct {
	Kind string `json:"kind"`

	// Op fields.
	Client    string `json:"client,omitempty"`
	Op        string `json:"op,omitempty"`
	Topic     string `json:"topic,omitempty"`
	Partition int32  `json:"partition"`
	Msg       string `json:"msg,omitempty"` // the message id carried inside the payload
	Call      int64  `json:"call"`
	Return    int64  `json:"ret"`
	Status    int    `json:"status"` // 0: no answer (timeout, connection refused or reset)
	Code      string `json:"code,omitempty"`
	Err       string `json:"err,omitempty"`
	Offset    int64  `json:"offset"`
	Handle    string `json:"handle,omitempty"`
	Attempt   int    `json:"attempt,omitempty"`   // delivery_attempt of a delivery; try number of a produce
	Timestamp int64  `json:"timestamp,omitempty"` // the message's server timestamp (Unix ms)
	Key       string `json:"key,omitempty"`
	Batch     bool   `json:"batch,omitempty"`
	// Node is the cluster node the attempt was sent to, or that a stats sample was read
	// through, or whose replica a replica line describes ("" for a single node).
	Node string `json:"node,omitempty"`

	// Fault fields: Call and Return are the fault's start and end. In a cluster,
	// Target is the node hurt; a stats sample's Target is the partition's leader.
	Fault  string `json:"fault,omitempty"`
	Target string `json:"target,omitempty"`
	Detail string `json:"detail,omitempty"`

	// Stats fields.
	HighWatermark int64 `json:"hw,omitempty"`
	Frontier      int64 `json:"frontier,omitempty"`
	Oldest        int64 `json:"oldest,omitempty"`
	Backlog       int64 `json:"backlog,omitempty"`
	InFlight      int64 `json:"in_flight,omitempty"`
	// Incarnation: on a stats sample and a create-topic 201, the topic's incarnation as
	// the broker reports it; on a delivery and a settle, the one its receipt handle names
	// (0: unknown); on a replica line, the one of the directory read.
	Incarnation int64 `json:"incarnation,omitempty"`
	// Epoch: on a stats sample of a replicated partition, the leader's term.
	Epoch int64 `json:"epoch,omitempty"`
	// IDs: on a replica line, the message id of every record the replica holds, in
	// offset order from Offset on ("" where a payload carries none).
	IDs []string `json:"ids,omitempty"`

	// ClockOffset (nanoseconds) is the wall-clock shift of a clock fault.
	ClockOffset int64 `json:"clock_offset_ns,omitempty"`
	// ClockDrift is, on a clock fault, how many seconds a second the node's wall clock
	// gains from the line on (negative: loses), on top of ClockOffset.
	ClockDrift float64 `json:"clock_drift,omitempty"`

	// Run fields (first line only).
	Run *RunInfo `json:"run,omitempty"`
}

// RunInfo describes a run: what the checker needs to know of the workload.
type RunInfo struct {
	Seed      int64          `json:"seed"`
	WallStart int64          `json:"wall_start_unix_nano"`
	Topics    []TopicInfo    `json:"topics"`
	Settings  map[string]any `json:"settings,omitempty"`
	// Nodes lists a cluster run's node ids; empty for a single node. With more than
	// one, the checker holds the cluster's contract (an ack answered 204 is committed
	// on a quorum: no crash excuses a delivery after it).
	Nodes []string `json:"nodes,omitempty"`
}

// TopicInfo is one topic of the workload.
type TopicInfo struct {
	Name         string `json:"name"`
	Partitions   int    `json:"partitions"`
	VisibilityMs int64  `json:"visibility_timeout_ms"`
	RetentionMs  int64  `json:"retention_ms"`
	Parent       string `json:"parent,omitempty"`
	DelayMs      int64  `json:"fanout_delay_ms,omitempty"`
	// Recreated: the workload deletes and recreates this topic under load, so offsets
	// start again in each incarnation and the checker keys everything by incarnation.
	Recreated bool `json:"recreated,omitempty"`
	// Replication is the topic's replication factor in a cluster run (0: a single node).
	Replication int `json:"replication_factor,omitempty"`
}

// Clock is the run's monotonic clock.
type Clock struct {
	start     time.Time
	monoStart int64 // CLOCK_MONOTONIC at start, 0 if it could not be read
}

// NewClock starts a clock now.
func NewClock() *Clock {
	// The monotonic reading is taken first, so a reading translated by FromMono is
	// never placed before the moment it was taken (at most the gap between the two
	// reads after it): read after, it placed an event microseconds before the
	// harness's own earlier reading on a loaded machine.
	mono := monoNanos()
	return &Clock{start: time.Now(), monoStart: mono}
}

// Now returns nanoseconds since the clock started.
func (c *Clock) Now() int64 { return int64(time.Since(c.start)) }

// Start returns the wall time the clock started at.
func (c *Clock) Start() time.Time { return c.start }

// FromWall converts a Unix time in nanoseconds (from another process) to the clock.
// It is off by however far the wall clock was stepped or slewed since the start: use
// FromMono where the other process gives a monotonic reading.
func (c *Clock) FromWall(unixNano int64) int64 { return unixNano - c.start.UnixNano() }

// WallDrift is how far the machine's wall clock has moved against the monotonic clock
// since the start: stepped or slewed by whatever keeps the machine's time (a VM's host,
// NTP). A node reads the wall clock at start, so this adds to its offset.
func (c *Clock) WallDrift() time.Duration {
	return time.Duration(time.Now().UnixNano() - c.start.UnixNano() - c.Now())
}

// FromMono converts a CLOCK_MONOTONIC reading in nanoseconds (from another process on
// this machine) to the clock; ok is false when the clock has no monotonic start.
func (c *Clock) FromMono(monoNano int64) (t int64, ok bool) {
	if c.monoStart == 0 || monoNano == 0 {
		return 0, false
	}
	return monoNano - c.monoStart, true
}

// monoNanos reads CLOCK_MONOTONIC, the clock behind Go's monotonic readings on Linux
// (so Now and FromMono share one timeline), and the clock failpoint lines report.
func monoNanos() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
		return 0
	}
	return ts.Nano()
}

// Writer appends entries to a file; it is safe for concurrent use.
type Writer struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
	n   int
}

// Create creates (truncates) the history file at path.
func Create(path string) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriterSize(f, 1<<16)
	return &Writer{f: f, w: w, enc: json.NewEncoder(w)}, nil
}

// Add writes one entry.
func (w *Writer) Add(e Entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.enc == nil {
		return
	}
	_ = w.enc.Encode(e) // Entry always encodes; a write error sticks in w.w and Close returns it
	w.n++
}

// Len returns how many entries were written.
func (w *Writer) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// Flush writes buffered entries to the file.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.w == nil {
		return nil
	}
	return w.w.Flush()
}

// Close flushes and closes the file; later Adds are dropped.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.w.Flush()
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.f, w.w, w.enc = nil, nil, nil
	return err
}

// Read reads a history file.
func Read(path string) ([]Entry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // opened read-only
	return Decode(f)
}

// Decode reads history lines from r.
func Decode(r io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	line := 0
	for sc.Scan() {
		line++
		if len(sc.Bytes()) == 0 {
			continue
		}
		var e Entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("history line %d: %w", line, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// Write writes entries to path (for doctored histories in tests).
func Write(path string, es []Entry) error {
	w, err := Create(path)
	if err != nil {
		return err
	}
	for _, e := range es {
		w.Add(e)
	}
	return w.Close()
}
