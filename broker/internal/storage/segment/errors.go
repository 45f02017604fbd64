package segment

import "errors"

// ErrFailed means a write or fsync of this log failed; the log refuses every
// later append until it is closed and opened again, because after a failed fsync
// nothing written since the last good one can be trusted to be on disk.
var ErrFailed = errors.New("segment: log failed closed after a write or fsync error")

// ErrNotUndone means a failed append could not be taken back (the truncate or the
// removal of what it wrote failed too): its records were never acknowledged nor read,
// but they may be found on disk when the log is opened again. Only the failing call
// gets it; later appends are refused with ErrFailed and wrote nothing.
var ErrNotUndone = errors.New("segment: the failed write could not be undone; its records may reappear when the log is reopened")

// ErrNoSpace means the file system ran out of space while writing an append. Nothing of
// that append was stored, the files were taken back to their durable state, and the
// log stays open: later appends succeed once space returns. (An fsync that fails, even
// with ENOSPC, still fails the log closed: after it, what is on disk is unknown.)
var ErrNoSpace = errors.New("segment: no space left on the device")

// ErrClosed means the log was closed.
var ErrClosed = errors.New("segment: log closed")

// ErrOffsetOutOfRange means the offset lies below Oldest (deleted by retention) or
// would move offsets backwards; callers clamp to Oldest and read again.
var ErrOffsetOutOfRange = errors.New("segment: offset out of range")

// ErrRecordTooLarge means a record's encoded size exceeds Options.MaxRecordBytes.
var ErrRecordTooLarge = errors.New("segment: record too large")

// ErrCorrupt means stored bytes failed their checks (length, CRC, offset or
// format); such a record is never returned.
var ErrCorrupt = errors.New("segment: corrupt record")

// ErrNotEmpty means SetNext was called on a log that still holds records.
var ErrNotEmpty = errors.New("segment: log is not empty")
