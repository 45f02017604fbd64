package broker

import (
	"context"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestDataFilesArePrivate: message data, settle state and metadata are readable by the
// broker's user only. Every file the broker writes is created 0600 and every directory
// 0700 (the umask can only take bits away); files a library creates inside such a
// directory are out of other users' reach.
func TestDataFilesArePrivate(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	b := mustStartBroker(t, dir)
	if _, err := b.CreateTopic(context.Background(), TopicSpec{Name: "secret", Partitions: ptr[int32](2)}); err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "secret", 20)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	checked := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if strings.HasPrefix(rel, filepath.Join("meta", "snapshots")) {
			return nil // made by the Raft library, inside meta/ (checked)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s has mode %v: other users can reach it", rel, info.Mode().Perm())
		}
		checked++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 10 {
		t.Fatalf("only %d paths checked", checked)
	}
}
