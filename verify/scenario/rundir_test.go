package scenario

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestARunIntoAUsedDirectoryStartsAfresh: a failed run keeps its files, data
// directories included, in the directory it was given (make's chaos targets give each
// tier one). The next run there started its nodes on them: they looked for the failed
// run's peers at its ports and the run ended "node not ready within 2m" with nothing
// tested. The old files move aside to dir.<time>, kept for inspection.
func TestARunIntoAUsedDirectoryStartsAfresh(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "runs")
	if err := os.MkdirAll(filepath.Join(dir, "data-n1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data-n1", "node-id"), []byte("n1"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, got, hist, rec, err := runFiles(context.Background(), "narad", dir, "p-", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	if got != dir || hist != filepath.Join(dir, "history.jsonl") {
		t.Fatalf("run files in %s (%s), want %s", got, hist, dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "data-n1")); !os.IsNotExist(err) {
		t.Fatalf("the last run's data directory is still in the new run's: %v", err)
	}
	moved, err := filepath.Glob(filepath.Join(root, "runs.*", "data-n1", "node-id"))
	if err != nil || len(moved) != 1 {
		t.Fatalf("the last run's files were not kept beside it: %v %v", moved, err)
	}
}
