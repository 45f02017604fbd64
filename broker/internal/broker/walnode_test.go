package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// copyDir copies the files of src into dst, keeping the tree.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestWALReplayedAtStart: appends answered in wal mode may be only in the write-ahead
// file after a power cut. A copy of a running node's directory whose segment files
// then lose everything (what the cut takes from files never synced) must come back
// whole, whether the next start runs in wal mode or not (an operator who switched to
// --sync-mode group): the start replays the write-ahead file before a log opens.
func TestWALReplayedAtStart(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	b, err := Open(Options{DataDir: dir, NodeID: "n1", Logger: quiet, WAL: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic(context.Background(), TopicSpec{Name: "t", Partitions: ptr[int32](2)}); err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "t", 50)
	if b.NodeStats().SyncMode != "wal" {
		t.Fatalf("sync mode %q", b.NodeStats().SyncMode)
	}
	cut := t.TempDir()
	copyDir(t, dir, cut) // nothing is written while it runs
	b.Close()

	lost := 0
	if err := filepath.WalkDir(filepath.Join(cut, "topics"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".log") && strings.Contains(p, string(filepath.Separator)+"log"+string(filepath.Separator)) {
			lost++
			return os.Truncate(p, 0)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if lost == 0 {
		t.Fatal("no segment file to take the data of")
	}
	for _, walMode := range []bool{false, true} {
		d := t.TempDir()
		copyDir(t, cut, d)
		b, err := Open(Options{DataDir: d, NodeID: "n1", Logger: quiet, WAL: walMode})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		_, parts, err := b.Topic("t")
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, p := range parts {
			n += p.Stats.End
		}
		b.Close()
		if n != 50 {
			t.Fatalf("wal mode %v: %d messages after the start, want the 50 answered", walMode, n)
		}
	}
}

// TestWALFailureIsReported: when the node's write-ahead file fails closed (here, as a
// data file's own failed sync does), StorageFailed receives the error once, so that
// `narad serve` can stop the process, the failure is counted, and the next produce is
// refused as not stored, not answered 202.
func TestWALFailureIsReported(t *testing.T) {
	t.Parallel()
	b := mustStart(t, Options{DataDir: t.TempDir(), NodeID: "n1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WAL: true})
	defer b.Close()
	if _, err := b.CreateTopic(context.Background(), TopicSpec{Name: "t", Partitions: ptr[int32](1)}); err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "t", 3)
	select {
	case err := <-b.StorageFailed():
		t.Fatalf("failure reported before any: %v", err)
	default:
	}
	b.wal.Fail(errors.New("injected: a lost write-back"))
	b.wal.Fail(errors.New("injected: a second one"))
	select {
	case err := <-b.StorageFailed():
		if !errors.Is(err, wal.ErrFailed) || !strings.Contains(err.Error(), "a lost write-back") {
			t.Fatalf("reported %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the write-ahead file's failure was not reported")
	}
	select {
	case err := <-b.StorageFailed():
		t.Fatalf("reported twice: %v", err)
	default:
	}
	if n := promtest.ToFloat64(b.Metrics().StorageErrors.WithLabelValues("wal")); n != 1 {
		t.Fatalf("narad_storage_errors_total{op=\"wal\"} = %v, want 1", n)
	}
	_, err := b.Produce(context.Background(), "t", []Outgoing{{Partition: -1, Value: []byte("after")}})
	if !errors.Is(err, ErrStorage) {
		t.Fatalf("produce after the failure: %v, want ErrStorage", err)
	}
}

// TestWALDamagedRecordIsReportedAtStart: a record of the write-ahead file that rotted
// before a start had to replay it is skipped, logged and counted
// (narad_storage_errors_total{op="wal_damaged"}), the records after it are replayed,
// and the partition whose file lacks the skipped bytes reports its damaged messages,
// in both sync modes.
func TestWALDamagedRecordIsReportedAtStart(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	b, err := Open(Options{DataDir: dir, NodeID: "n1", Logger: quiet, WAL: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic(context.Background(), TopicSpec{Name: "t", Partitions: ptr[int32](1)}); err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "t", 10) // one at a time: one record each
	cut := t.TempDir()
	copyDir(t, dir, cut) // nothing is written while it runs
	b.Close()
	// The power cut took the segment files' data; the first record of the write-ahead
	// file rotted (the last byte of its message).
	if err := filepath.WalkDir(filepath.Join(cut, "topics"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".log") && strings.Contains(p, string(filepath.Separator)+"log"+string(filepath.Separator)) {
			return os.Truncate(p, 0)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(cut, "wal", "00000000.wal")
	w, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	end := 32 + 16 + int(binary.LittleEndian.Uint32(w[32:]))
	w[end-1] ^= 0x01
	if err := os.WriteFile(name, w, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, walMode := range []bool{false, true} {
		d := t.TempDir()
		copyDir(t, cut, d)
		b, err := Open(Options{DataDir: d, NodeID: "n1", Logger: quiet, WAL: walMode})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		walDamaged := promtest.ToFloat64(b.Metrics().StorageErrors.WithLabelValues("wal_damaged"))
		ds, err := b.Consume(context.Background(), "t", 100, 0) // the damaged one is skipped at its turn
		if err != nil {
			t.Fatal(err)
		}
		damaged := promtest.ToFloat64(b.Metrics().Damaged.WithLabelValues("t", "messages"))
		_, parts, err := b.Topic("t")
		if err != nil {
			t.Fatal(err)
		}
		end := parts[0].Stats.End
		b.Close()
		if walDamaged != 1 || damaged != 1 || end != 10 || len(ds) != 9 {
			t.Fatalf("wal mode %v: %v damaged write-ahead records and %v damaged messages counted, log end %d, %d delivered; want 1, 1, 10 and 9",
				walMode, walDamaged, damaged, end, len(ds))
		}
	}
}
