// Package failpoint lets crash and fault tests act at named points of the storage code:
// kill the process there, sleep (a slow disk), panic, or make the write fail as if the
// disk returned EIO or ran out of space.
//
// Without the build tag `failpoints` every function here is an empty stub the compiler
// inlines away, so a normal build carries no failpoint code and reads no environment.
// With the tag, points are armed at process start from NARAD_FAILPOINTS:
//
//	NARAD_FAILPOINTS="segment-after-write:kill@40;partition-before-rename-queue.ckpt:sleep(2s)"
//
// Each entry is name:action, optionally followed by @N (act only on the N-th hit of that
// point in this process) or @N+ (on the N-th hit and every one after it: a disk that
// turns slow and stays slow); without either, on every hit. Actions: kill (SIGKILL the process
// itself), sleep(DURATION), panic, eio and enospc (Err returns the error; Inject ignores
// them). Before acting, a point writes one line to stderr,
//
//	narad failpoint fired: name=NAME action=ACTION hit=N unix_nano=T mono_nano=M
//
// so a test harness can tell a failpoint kill from its own kill -9 and knows when it
// happened: M is CLOCK_MONOTONIC, which a harness on the same machine can place on its
// own timeline even when the wall clock (T) was stepped. Names are listed in Points.
package failpoint

import "time"

// The named points. Each is one call in the storage code; see the comment at the call.
const (
	// SegmentAfterWrite: a commit group's bytes are written to a segment file, not yet
	// fsynced (an error here stands for a failed fsync).
	SegmentAfterWrite = "segment-after-write"
	// SegmentAfterFsync: every chunk of a commit group is fsynced, the records are not yet
	// visible to readers and the callers have not been answered.
	SegmentAfterFsync = "segment-after-fsync"
	// SegmentUndo: a commit group failed and its files are being taken back; an error
	// here stands for a failed truncate or removal (the undo gives up).
	SegmentUndo = "segment-undo"
	// SegmentRollCreated: a new segment file was created by a roll, its directory entry
	// not yet fsynced.
	SegmentRollCreated = "segment-roll-created"
	// SegmentRetentionDelete: between the removal of two whole segments by retention or
	// journal compaction (one segment's files are gone, the next one's not yet).
	SegmentRetentionDelete = "segment-retention-delete"
	// SegmentRetentionUnlink: a segment's .log was unlinked, its .index not yet.
	SegmentRetentionUnlink = "segment-retention-unlink"
	// WALAfterWrite: a round of the node's write-ahead file is written, its fdatasync
	// done, the callers not yet answered (an error here stands for a failed fdatasync,
	// which fails the write-ahead file closed).
	WALAfterWrite = "wal-after-write"
	// WALSync: a round of the node's write-ahead file is written, its fdatasync about to
	// start. A sleep here is a slow disk as the round meets it (Stall): when the round
	// syncs holding the writer's processor, so does the sleep.
	WALSync = "wal-sync"
	// PartitionAfterAppend: a message batch is durable in the partition log, the produce
	// (or fan-out copy) has not been answered yet; on a replica, a committed batch is
	// written to its message log, not yet marked applied.
	PartitionAfterAppend = "partition-after-append"
	// PartitionAfterSettle: a settle batch is durable in the journal, not yet applied to
	// the queue state, the ack not yet answered (on a replica: written, not yet applied).
	PartitionAfterSettle = "partition-after-settle"
	// PartitionBeforeRename is a prefix: the full name adds the file, e.g.
	// "partition-before-rename-queue.ckpt" or "partition-before-rename-epoch". The new
	// file is written and fsynced under its .tmp name, not yet renamed over the old one.
	PartitionBeforeRename = "partition-before-rename-"
	// PartitionCkptBeforeRename is the checkpoint's instance of PartitionBeforeRename.
	PartitionCkptBeforeRename = PartitionBeforeRename + "queue.ckpt"
	// PartitionEpochBeforeRename is the lease epoch file's instance.
	PartitionEpochBeforeRename = PartitionBeforeRename + "epoch"
	// ReplicaTakeover: a replica's group was replaced by a forced takeover that made
	// this node the survivor; the node has neither applied the replaced group's log nor
	// opened the new group yet.
	ReplicaTakeover = "replica-takeover"
	// MetaStoreWrite: the control plane's Raft is about to write its log or its term
	// and vote to its store (a bbolt commit and fsync). A sleep here is a slow disk as
	// the control plane meets it.
	MetaStoreWrite = "meta-store-write"
)

// Points lists every named point, for harnesses that pick one at random.
var Points = []string{
	SegmentAfterWrite, SegmentAfterFsync, SegmentUndo, SegmentRollCreated, SegmentRetentionDelete,
	SegmentRetentionUnlink, WALSync, WALAfterWrite, PartitionAfterAppend, PartitionAfterSettle,
	PartitionCkptBeforeRename, PartitionEpochBeforeRename, ReplicaTakeover, MetaStoreWrite,
}

// EnvVar is the environment variable read at start when built with the tag.
const EnvVar = "NARAD_FAILPOINTS"

// ClockEnvVar, read at start when built with the tag, shifts the wall clock the process
// reads at start by a Go duration ("-1h", "90s"): a test's stand-in for a step of the
// system clock before a restart, which a test on a shared machine cannot make for real.
// Monotonic time (leases, timeouts) is not shifted, as a real clock step does not move
// it either.
const ClockEnvVar = "NARAD_CLOCK_OFFSET"

// ClockDriftEnvVar, read at start when built with the tag, makes the wall clock the
// process reads drift: it gains that many seconds a second ("0.02": 20 ms a second
// fast, "-0.01" slow) from the start on, a test's stand-in for a machine whose clock
// runs fast or slow. Monotonic time is not drifted.
const ClockDriftEnvVar = "NARAD_CLOCK_DRIFT"

// FileEnvVar, read at start when built with the tag, names a file read again every
// FilePoll while the process runs: when its content changes, it replaces every armed
// point (the NARAD_FAILPOINTS syntax; empty disarms them all), and the process writes
// "narad failpoints: now \"SPEC\"" to stderr. At start it writes "narad failpoints:
// file=PATH", and a file that is not empty then is applied at once. A harness arms a
// point in a running process this way (a disk that turns slow and quick again).
const FileEnvVar = "NARAD_FAILPOINTS_FILE"

// FilePoll is how often the file named by FileEnvVar is read.
const FilePoll = 100 * time.Millisecond

// FilePrefix starts the stderr lines about that file.
const FilePrefix = "narad failpoints:"

// FiredPrefix starts the stderr line a point writes before it acts.
const FiredPrefix = "narad failpoint fired:"
