package format

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// Downgrade takes the data directory dir of a stopped node back to format to, so that
// a binary that knows only that format starts on it: the rollback of an upgrade in
// place, without a backup (a backup restored on a cluster node would bring back a Raft
// vote and log it has since moved past; see docs/operating/upgrades.md). It runs each
// step's undo from the directory's format down, then writes FORMAT.
//
// It refuses a directory in use (the data directory's lock, see Lock, or, for a node
// of a binary from before that lock, its control-plane store's), a directory newer
// than this binary knows, and a step that cannot be undone (format 1
// is reached only by a backup). A crash part-way leaves the directory at its format
// (FORMAT is written last and every undo is safe to run twice), readable by this
// binary; run it again. A directory already at to or older is left at its format
// (below 3: synced, and a wal/ found beside it folded).
func Downgrade(dir string, to int, opts Options) (Result, error) {
	return downgrade(dir, to, opts, Current, steps)
}

func downgrade(dir string, to int, opts Options, current int, steps []step) (Result, error) {
	log, me := opts.logger(), opts.name()
	if to < 1 {
		return Result{}, fmt.Errorf("%w: there is no format %d (formats start at 1); give the format the older binary names when it refuses to start", ErrNoDowngrade, to)
	}
	if fi, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return Result{}, fmt.Errorf("%s does not exist: check --data-dir", dir)
	} else if err == nil && !fi.IsDir() {
		return Result{}, fmt.Errorf("%s is not a directory: check --data-dir", dir)
	}
	unlock, err := Lock(dir)
	if errors.Is(err, fs.ErrPermission) {
		return Result{}, fmt.Errorf("%w: run the downgrade as the user the node runs as, or as root", err)
	}
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	// A binary from before the directory lock holds only its control-plane store's.
	unlockStore, err := lockStore(dir)
	if err != nil {
		return Result{}, err
	}
	defer unlockStore()
	st, isNew, err := stamped(dir)
	if err != nil {
		return Result{}, err
	}
	if isNew {
		return Result{}, fmt.Errorf("%s holds no narad data directory (no FORMAT, node-id, meta/ or topics/): check --data-dir", dir)
	}
	res := Result{Found: st.Format}
	switch {
	case st.Format > current:
		return res, fmt.Errorf("%w: %s is at format %d, but %s knows formats up to %d; run the downgrade with a binary that knows format %d",
			ErrTooNew, dir, st.Format, me, current, st.Format)
	case to >= st.Format:
		if to < 3 {
			// No binary leaves wal/ beside a FORMAT below 3, but a directory put
			// together by hand might: what it holds belongs in the files.
			if _, err := os.Stat(filepath.Join(dir, "wal")); err == nil {
				res.Folded = true
			}
			return res, foldWAL(dir, log)
		}
		return res, nil
	}
	todo := steps[to-1 : st.Format-1] // the steps to formats to+1 … st.Format
	for i := len(todo) - 1; i >= 0; i-- {
		if todo[i].down == nil {
			return res, fmt.Errorf("%w: the step to format %d cannot be undone in place, so %s goes back to format %d only by restoring a backup taken before it was upgraded (docs/operating/upgrades.md); nothing was changed",
				ErrNoDowngrade, todo[i].to, dir, todo[i].to-1)
		}
	}
	log.Info("downgrading the data directory", "dir", dir, "from_format", st.Format, "to_format", to)
	for i := len(todo) - 1; i >= 0; i-- {
		s := todo[i]
		log.Info("data directory downgrade step", "from_format", s.to, "to_format", s.to-1)
		if err := s.down(dir, log); err != nil {
			return res, fmt.Errorf("undoing the step to format %d: %w. The directory stays at format %d, which %s reads; fix the cause and run the downgrade again",
				s.to, err, st.Format, me)
		}
	}
	// Run as root on a directory the broker's user owns, FORMAT must stay readable by
	// that user: it gets the directory's owner.
	if err := write(dir, Stamp{Format: to, WrittenBy: me + " (downgrade)"}, ownerOf(dir)); err != nil {
		return res, fmt.Errorf("writing %s: %w. Every step was undone, but the directory still says format %d, which %s reads; fix the cause and run the downgrade again",
			FileName, err, st.Format, me)
	}
	log.Info("data directory downgraded", "dir", dir, "format", to)
	return res, nil
}

// Lock takes the data directory's lock (flock(2) on the directory itself, so nothing is
// created that another user might not open): a node holds it from before it reads
// the directory until it has closed everything in it, and a downgrade while it works,
// so that neither a second node nor a downgrade runs on a directory in use. It fails
// at once when the lock is held. The returned func releases it.
func Lock(dir string) (func(), error) {
	unlock, err := flock(dir)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, fmt.Errorf("%w: %s is locked by another process (a node running on it, or a downgrade-format); stop the node (SIGTERM, then wait for \"narad stopped\") or let the other finish", ErrInUse, dir)
	}
	return unlock, err
}

// flock opens path read-only and takes flock(2) on it, failing at once when it is held
// (syscall.EWOULDBLOCK). Closing the returned func's file releases it.
func flock(path string) (func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close() // the lock error is the one to report
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, err
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { _ = f.Close() }, nil // closing releases the lock; nothing was written through it
}

// ownerOf returns dir's owner when this process runs as root and someone else owns
// dir (files written for that owner must be given to it), or nil.
func ownerOf(dir string) *owner {
	if os.Geteuid() != 0 {
		return nil
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == 0 {
		return nil
	}
	return &owner{uid: int(st.Uid), gid: int(st.Gid)}
}

// lockStore takes the lock a running node holds on its control-plane store
// (meta/raft.db, locked by bbolt while open), so no node runs on dir while a
// downgrade rewrites it; the returned func releases it. A directory without the store
// (a node that never started its control plane) is not locked.
func lockStore(dir string) (func(), error) {
	path := filepath.Join(dir, "meta", "raft.db")
	unlock, err := flock(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return func() {}, nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		return nil, fmt.Errorf("%w: %s is locked; stop the node (SIGTERM, then wait for \"narad stopped\") and run the downgrade again", ErrInUse, path)
	}
	return unlock, err
}

// foldWAL undoes the step to format 3: it redoes every record of the write-ahead file
// wal/ not yet in its data file (a node stopped by a crash leaves some), makes those
// files durable, removes wal/, and then makes every file and directory of dir durable
// (syncAll). A binary of format 2 knows no write-ahead file; the logs it opens then
// hold every answered append.
func foldWAL(dir string, log *slog.Logger) error { return fold(vfs.OS{}, dir, log) }

// fold is foldWAL on the file system fsys.
func fold(fsys vfs.FS, dir string, log *slog.Logger) error {
	wdir := filepath.Join(dir, "wal")
	if _, err := fsys.Stat(wdir); errors.Is(err, fs.ErrNotExist) {
		return syncAll(fsys, dir)
	} else if err != nil {
		return err
	}
	rep, err := wal.Replay(wdir, wal.Options{FS: fsys, Root: dir})
	if err != nil {
		return fmt.Errorf("replaying the write-ahead file: %w", err)
	}
	log.Info("replayed the write-ahead file into the partitions' files", "files", rep.Files, "records", rep.Records, "skipped", rep.Skipped)
	if rep.Damaged > 0 {
		log.Error("the write-ahead file held records that failed their checks with valid ones after them (damaged at rest, or torn by a power cut within its last round, which was never answered): skipped, the records after them replayed; a partition whose file lacked a skipped record's bytes reports them as damaged when it opens",
			"damaged", rep.Damaged, "first", rep.FirstDamaged)
	}
	if rep.DamagedHeaders > 0 {
		log.Error(wal.DamagedHeadersMessage, "files", rep.DamagedHeaders, "first", rep.FirstDamagedHeader)
	}
	// The files first, the sequence floor last (RemoveFiles), then the empty
	// directory: a crash part-way leaves a directory this binary still opens safely.
	if err := wal.RemoveFiles(fsys, wdir); err != nil {
		return err
	}
	if err := fsys.Remove(wdir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return syncAll(fsys, dir) // dir last, with wal/ gone from it
}

// syncAll makes every file and directory under dir durable as it reads now, dir
// itself last. A node killed with -9 leaves writes in the page cache that no
// write-ahead record covers (an append or a Raft term and vote written, its commit not
// made; a file renamed into place, its directory not synced). This binary syncs what
// it reads before trusting it when it starts; a binary of format 2 does not, and would
// act on what a power loss can still take back (serve a message and take its ack, then
// lose the message; vote twice in a term). One sync per file: a second or so for ten
// thousand files already on the disk. Symbolic links are synced as what they name,
// directories among them without their contents. What this process may not read is
// not the node's (every file a node writes is its user's): lost+found, when the data
// directory is a file system's root.
func syncAll(fsys vfs.FS, dir string) error {
	ents, err := fsys.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		path := filepath.Join(dir, e.Name)
		if e.IsDir {
			if err := syncAll(fsys, path); err != nil && !errors.Is(err, fs.ErrPermission) {
				return err
			}
			continue
		}
		f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			continue // a symbolic link that names nothing, or not the node's
		}
		if err != nil {
			return err
		}
		err = f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("syncing %s: %w", path, err)
		}
	}
	return fsys.SyncDir(dir)
}
