package broker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/raftetcd"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/transport"
)

// TestTermsAfterAReplacedGroupWithADamagedLog: a forced takeover makes a new group over
// the survivor's data, and its first term is read from the replaced group's Raft log on
// that node (termsAfterReplaced). A forced takeover is what an operator runs after a
// disaster, when that old log may be damaged: it must not keep the new group from
// opening (the partition would never lead again, the takeover done for nothing). The
// new group starts above any term the old one can have reached instead.
// soloRaftHost starts a Raft host of one member (id 1) in dir, on a node plane on
// 127.0.0.1 (a free port), both stopped when the test ends; tweak may change its
// options first.
func soloRaftHost(t *testing.T, dir string, tweak func(*raftetcd.Options)) *raftetcd.Host {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := transport.New(transport.Options{NodeID: "n1", ListenAddr: "127.0.0.1:0", Secret: []byte("solo-raft-host-test-secret-01234"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	fss, err := vfs.NewFSSyncer(dir)
	if err != nil {
		t.Fatal(err)
	}
	sg := vfs.NewSyncGroup(fss)
	t.Cleanup(sg.Close)
	o := raftetcd.Options{Node: n, ID: 1, Peers: map[uint64]string{1: n.Addr()}, Dir: dir, Sync: sg,
		Store: raftetcd.StoreRaftstore, Tick: 30 * time.Millisecond, Logger: quiet}
	tweak(&o)
	h, err := raftetcd.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func TestTermsAfterAReplacedGroupWithADamagedLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := soloRaftHost(t, dir, func(*raftetcd.Options) {})
	partDir := filepath.Join(dir, "part")
	old := filepath.Join(partDir, "raft")
	if err := h.OpenGroup("old", raftetcd.GroupConfig{Voters: []uint64{1}, Dir: old, Campaign: true,
		Apply: func(uint64, []byte) any { return nil }}); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		pollUntil(t, fmt.Sprintf("write %d", i), func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := h.Propose(ctx, "old", []byte(fmt.Sprintf("entry %03d of the replaced group", i)))
			return err
		})
	}
	info, _ := h.Info("old")
	h.CloseGroup("old")
	b := &Broker{log: slog.New(slog.NewTextHandler(io.Discard, nil)), repl: &replication{host: h}}
	healthy, err := b.termsAfterReplaced(partDir, filepath.Join(partDir, "raft-f1"))
	if err != nil || healthy <= info.Term {
		t.Fatalf("the first term over an intact replaced log: %d, %v; want above %d", healthy, err, info.Term)
	}
	// Damage a record in the middle of the old log's largest file.
	var biggest string
	var size int64
	_ = filepath.Walk(old, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && fi.Size() > size {
			biggest, size = p, fi.Size()
		}
		return nil
	})
	f, err := os.OpenFile(biggest, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	one := make([]byte, 1)
	if _, err := f.ReadAt(one, size/2); err != nil {
		t.Fatal(err)
	}
	one[0] ^= 0x5a
	if _, err := f.WriteAt(one, size/2); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if _, err := h.LastTerm(old); err == nil {
		t.Fatalf("the damaged log %s reads whole: the test damaged nothing", biggest)
	}
	got, err := b.termsAfterReplaced(partDir, filepath.Join(partDir, "raft-f1"))
	if err != nil {
		t.Fatalf("a replaced group's damaged log keeps the new group from opening: %v", err)
	}
	if got < healthy {
		t.Fatalf("over a damaged replaced log the new group starts in term %d, below %d, which the intact log gave", got, healthy)
	}
	if got >= 1<<32 {
		t.Fatalf("first term %d does not fit a receipt handle's epoch", got)
	}
}
