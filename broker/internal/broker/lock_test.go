package broker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/format"
)

// TestSecondOpenOfADirectoryInUseIsRefused: a second broker on a data directory in
// use is refused at once, before it reads anything (the write-ahead file stays the
// first one's), and opens once the first has closed. Before the directory lock the
// second opened and replayed wal/, then waited for ever on the control-plane store.
func TestSecondOpenOfADirectoryInUseIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := Options{DataDir: dir, NodeID: "n1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WAL: true}
	open := func() (*Broker, error) { return Open(opts) }
	b := mustStart(t, opts)
	if _, err := b.CreateTopic(context.Background(), TopicSpec{Name: "t"}); err != nil {
		t.Fatal(err)
	}
	walBefore, err := os.ReadDir(filepath.Join(dir, "wal"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := open()
	if err == nil {
		_ = second.Close()
		t.Fatal("a second broker opened a data directory in use")
	}
	if !errors.Is(err, format.ErrInUse) {
		t.Fatalf("a second Open answered %v; want format.ErrInUse", err)
	}
	walAfter, err := os.ReadDir(filepath.Join(dir, "wal"))
	if err != nil || len(walAfter) != len(walBefore) {
		t.Fatalf("the refused Open touched wal/: %d entries before, %d after (%v)", len(walBefore), len(walAfter), err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	again := mustStart(t, opts)
	if _, err := again.lookupLocal("t"); err != nil {
		t.Fatalf("after the first closed, the directory opened without its topic: %v", err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
}
