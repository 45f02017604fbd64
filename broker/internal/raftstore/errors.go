package raftstore

import "errors"

// ErrCorrupt is returned when bytes on disk that the store relies on fail their
// checks: a damaged record with valid records after it, a sealed segment that does
// not reach the next one, a state or snapshot file whose every copy is bad, or a log
// whose terms go backwards. The error text names the file and the byte offset. The
// store never repairs these by itself: the replica is rebuilt from its peers.
var ErrCorrupt = errors.New("raftstore: corrupt raft log")

// ErrFailed is returned by every write after a write, truncate, fsync or removal
// failed. What is on disk may then be ahead of what the store acknowledged; only a
// reopen (whose recovery reads the disk) makes the store usable again.
var ErrFailed = errors.New("raftstore: store failed closed after a write error; reopen it")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("raftstore: store closed")

// ErrNotContiguous is returned by Append for entries whose indexes do not follow
// each other, or that would leave a gap after the last stored entry.
var ErrNotContiguous = errors.New("raftstore: entries are not contiguous with the log")

// ErrOutOfRange is returned for an index past the last stored entry where raft's
// MemoryStorage would panic (Compact, CreateSnapshot, Entries with hi too large).
var ErrOutOfRange = errors.New("raftstore: index past the last stored entry")

// ErrEntryTooLarge is returned by Append for an entry whose marshalled size is above
// Options.MaxEntryBytes: recovery would take its frame for damage.
var ErrEntryTooLarge = errors.New("raftstore: entry larger than MaxEntryBytes")
