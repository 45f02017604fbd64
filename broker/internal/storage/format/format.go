// Package format keeps the version of a data directory's on-disk format in a FORMAT
// file at its root, and checks it before anything else in the directory is read.
//
// A binary knows the formats up to Current. It refuses a directory of a newer format
// (it would misread it), upgrades an older one explicitly, step by step, and writes the
// new version only after every step has succeeded, so a crash during an upgrade leaves
// the old version in place and the next start runs the (idempotent) steps again.
//
// One version covers the whole directory: every partition is opened by the same binary
// after the upgrade ran, so partitions cannot be at different formats. Files that an
// upgrade might convert lazily, one partition at a time, would need a version of their
// own; none does today, and each partition file already carries a version byte or magic
// that refuses an unknown layout (docs/internals/storage-format.md).
package format

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// FileName is the version file at the root of a data directory.
const FileName = "FORMAT"

// Current is the format this binary writes. Every change to what a data directory holds
// that an older binary would misread bumps it, with a step in steps and a test (see
// docs/internals/storage-format.md, "Changing the format").
const Current = 3

// Errors Prepare wraps; the wrapping message says what to do.
var (
	ErrTooNew        = errors.New("the data directory's format is newer than this binary knows")
	ErrUnreadable    = errors.New("the data directory's FORMAT file is unreadable")
	ErrNeedsUpgrade  = errors.New("the data directory needs an upgrade that must be asked for")
	ErrUpgradeFailed = errors.New("upgrading the data directory failed")
	ErrNoDowngrade   = errors.New("the data directory cannot be taken back to that format")
	ErrInUse         = errors.New("the data directory is in use by a running node")
)

// Stamp is the body of the FORMAT file.
type Stamp struct {
	// Format is the version of the directory's on-disk format.
	Format int `json:"format"`
	// WrittenBy names the binary that set this format (created the directory or
	// upgraded it), for the operator who has to find a binary that reads it.
	WrittenBy string `json:"written_by,omitempty"`
}

// Options configures Prepare.
type Options struct {
	// WrittenBy names this binary (e.g. "narad 1.4.0"); it goes into a FORMAT file
	// Prepare writes and into its error messages.
	WrittenBy string
	// Logger gets one line per upgrade step; nil means slog.Default().
	Logger *slog.Logger
	// AllowUpgrade lets steps marked confirm run. Without it, a directory that needs
	// one is refused with ErrNeedsUpgrade.
	AllowUpgrade bool
}

// Result says what Prepare found and did.
type Result struct {
	// Found is the format the directory was at: 0 for a new directory.
	Found int
	// Upgraded is true when Prepare upgraded the directory to Current.
	Upgraded bool
	// Folded is true when Downgrade, finding the directory at the format asked for
	// already, folded a write-ahead directory it found beside it into the files.
	Folded bool
}

// step upgrades a directory from format to-1 to format to.
type step struct {
	to int
	// what is logged before the step runs.
	what string
	// confirm marks a step that an operator must ask for (Options.AllowUpgrade): one
	// that rewrites existing data so that only a backup brings back the older format.
	// A step that only adds, or changes nothing an older binary needs, runs on its own.
	confirm bool
	run     func(dir string, log *slog.Logger) error
	// down undoes the step on a stopped node's directory: afterwards a binary of
	// format to-1 reads it as its own, with nothing lost. Nil: the step cannot be
	// undone in place, only by restoring a backup.
	down func(dir string, log *slog.Logger) error
}

// steps lists every upgrade, in order; steps[i].to is i+2 (format 1 is the first).
var steps = []step{
	{
		to: 2,
		what: "format 2: partition logs gain a recovery-point file (written from now on, nothing to convert); " +
			"control-plane commands gain owner IDs and the last-admin rule (old commands are converted as they are applied, nothing to rewrite); " +
			"files become 0600 and directories 0700 (tightened now)",
		run: tightenModes,
	},
	{
		to: 3,
		what: "format 3: the node-wide write-ahead file wal/ (created at start, nothing to convert); " +
			"a binary of format 2 would not replay it after a crash and would cut acknowledged appends from the logs",
		run:  func(string, *slog.Logger) error { return nil },
		down: foldWAL,
	},
}

// markers are the entries a data directory of any format holds once a binary has
// started on it; a directory with none of them is new.
var markers = []string{"node-id", "topics", "meta"}

// Prepare checks the format of the data directory dir before anything else reads it:
// it creates a new directory at Current, refuses one newer than Current, and upgrades
// an older one (a directory with data but no FORMAT file is format 1).
func Prepare(dir string, opts Options) (Result, error) {
	return prepare(dir, opts, Current, steps)
}

// logger is the logger to use: Logger, or slog's default.
func (o Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.Default()
	}
	return o.Logger
}

// name is how messages name this binary: WrittenBy, or "this binary".
func (o Options) name() string {
	if o.WrittenBy == "" {
		return "this binary"
	}
	return o.WrittenBy
}

// stamped reads dir's format: its FORMAT file, or format 1 for a directory that holds
// data without one; isNew when it holds neither.
func stamped(dir string) (st Stamp, isNew bool, err error) {
	st, found, err := Read(dir)
	if err != nil || found {
		return st, false, err
	}
	used, err := holdsData(dir)
	if err != nil || !used {
		return Stamp{}, err == nil, err
	}
	return Stamp{Format: 1}, false, nil
}

func prepare(dir string, opts Options, current int, steps []step) (Result, error) {
	log, me := opts.logger(), opts.name()
	st, isNew, err := stamped(dir)
	if err != nil {
		return Result{}, err
	}
	if isNew {
		if err := vfs.MkdirAllSync(vfs.OS{}, dir, 0o700); err != nil {
			return Result{}, err
		}
		return Result{}, Write(dir, Stamp{Format: current, WrittenBy: opts.WrittenBy})
	}
	res := Result{Found: st.Format}
	switch {
	case st.Format > current:
		by := ""
		if st.WrittenBy != "" {
			by = " (written by " + st.WrittenBy + ")"
		}
		return res, fmt.Errorf("%w: %s is at format %d%s, but %s knows formats up to %d. "+
			"Start it with a binary that knows format %d; to run this one, take the directory back with that binary "+
			"(narad downgrade-format --to %d, the node stopped) or restore a backup taken before it was upgraded to format %d "+
			"(docs/operating/upgrades.md)", ErrTooNew, dir, st.Format, by, me, current, st.Format, current, st.Format)
	case st.Format == current:
		return res, nil
	}

	todo := steps[st.Format-1 : current-1]
	for _, s := range todo {
		if s.confirm && !opts.AllowUpgrade {
			return res, fmt.Errorf("%w: %s is at format %d and %s needs it at format %d; the step to format %d "+
				"cannot be undone except from a backup. Back the directory up, then start once with --upgrade-format, "+
				"or run the binary that wrote it (docs/operating/upgrades.md)", ErrNeedsUpgrade, dir, st.Format, me, current, s.to)
		}
	}
	log.Info("upgrading the data directory", "dir", dir, "from_format", st.Format, "to_format", current,
		"rollback", rollback(st.Format, current, todo))
	for _, s := range todo {
		log.Info("data directory upgrade step", "to_format", s.to, "what", s.what)
		if err := s.run(dir, log); err != nil {
			return res, fmt.Errorf("%w: step to format %d: %w. The directory stays at format %d; fix the cause and start again, "+
				"or restore the backup", ErrUpgradeFailed, s.to, err, st.Format)
		}
	}
	if err := Write(dir, Stamp{Format: current, WrittenBy: opts.WrittenBy}); err != nil {
		return res, fmt.Errorf("%w: writing %s: %w", ErrUpgradeFailed, FileName, err)
	}
	log.Info("data directory upgraded", "dir", dir, "format", current)
	res.Upgraded = true
	return res, nil
}

// rollback is what the upgrade's log says about going back from format current to a
// binary that knows only format from: the downgrade in place when every step from
// there has its undo (a backup restored on a cluster node would bring back Raft votes
// and logs the cluster has moved past), else the backup, and how far the downgrade
// goes when it goes part of the way.
func rollback(from, current int, todo []step) string {
	low := current // the oldest format the steps' undos reach
	for i := len(todo) - 1; i >= 0 && todo[i].down != nil; i-- {
		low = todo[i].to - 1
	}
	s := fmt.Sprintf("after this start only a binary that knows format %d reads the directory; ", current)
	if low <= from {
		return s + fmt.Sprintf("to go back to one that knows only format %d, stop the node and run narad downgrade-format --to %d with this binary "+
			"(on a cluster node, not a restore of a backup: docs/operating/upgrades.md)", from, from)
	}
	s += fmt.Sprintf("to go back to one that knows only format %d, restore a backup taken before this start", from)
	if low < current {
		s += fmt.Sprintf(" (narad downgrade-format --to %d takes the directory back as far as format %d)", low, low)
	}
	return s
}

// Read returns the FORMAT file of dir; found is false when there is none.
func Read(dir string) (st Stamp, found bool, err error) {
	path := filepath.Join(dir, FileName)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Stamp{}, false, nil
	}
	if err != nil {
		return Stamp{}, false, err
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Format < 1 {
		why := "no format of 1 or more"
		if err != nil {
			why = err.Error()
		}
		return Stamp{}, true, fmt.Errorf("%w: %s holds %q (%s). Restore it from a backup; if you know which format the "+
			"directory is at, write {\"format\":N} into it", ErrUnreadable, path, truncate(string(b), 64), why)
	}
	return st, true, nil
}

// Write replaces dir's FORMAT file atomically and durably: a temporary file is written
// and fsynced, renamed over the old one, and dir is fsynced, so a crash leaves the old
// file or the new one, whole.
func Write(dir string, st Stamp) error { return write(dir, st, nil) }

// owner is a file's owner to set, by numeric ids.
type owner struct{ uid, gid int }

// write is Write, giving the file to own first when it is not nil.
func write(dir string, st Stamp, own *owner) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	path := filepath.Join(dir, FileName)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close() // the write error is the one to report
		return err
	}
	if own != nil {
		if err := f.Chown(own.uid, own.gid); err != nil {
			_ = f.Close() // the chown error is the one to report
			return err
		}
	}
	if err := f.Sync(); err != nil {
		_ = f.Close() // the sync error is the one to report
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return vfs.OS{}.SyncDir(dir)
}

// holdsData reports whether dir holds anything a narad binary writes.
func holdsData(dir string) (bool, error) {
	for _, m := range markers {
		_, err := os.Lstat(filepath.Join(dir, m))
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
	}
	return false, nil
}

// tightenModes takes group and other permissions away from dir and everything in it:
// format 1 binaries created files 0644 and directories 0755, format 2 creates them 0600
// and 0700. Symbolic links are left alone (their mode means nothing).
func tightenModes(dir string, log *slog.Logger) error {
	// The data directory itself may be a symbolic link (to another disk); WalkDir would
	// not follow it.
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	changed := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode().Perm()
		if mode&0o077 == 0 {
			return nil
		}
		if err := os.Chmod(path, mode&^0o077); err != nil {
			return fmt.Errorf("%w (run chmod -R go= %s as its owner, or start narad as the directory's owner)", err, dir)
		}
		changed++
		return nil
	})
	if err != nil {
		return err
	}
	log.Info("took group and other permissions away", "dir", dir, "entries", changed)
	return nil
}

func truncate(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
