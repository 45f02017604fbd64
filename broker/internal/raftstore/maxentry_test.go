package raftstore

import (
	"bytes"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestEntryAtMaxEntryBytes: an entry of exactly MaxEntryBytes is stored and read back
// after a power loss (the frame check on Open takes the same bound as Save); one byte
// more is refused without failing the store. Segments and the cache are smaller than
// the entry.
func TestEntryAtMaxEntryBytes(t *testing.T) {
	for _, cache := range []int{-1, 0} {
		mem := vfs.NewMem()
		e := raftpb.Entry{Index: 1, Term: 1, Data: bytes.Repeat([]byte{7}, 200)}
		max := e.Size()
		opts := Options{MaxEntryBytes: max, SegmentBytes: 100, CacheEntries: cache, CacheBytes: 10}
		s := openOn(t, mem, opts)
		if err := s.Append([]raftpb.Entry{e}); err != nil {
			t.Fatal(err)
		}
		big := raftpb.Entry{Index: 2, Term: 1, Data: bytes.Repeat([]byte{7}, 201)}
		if err := s.Append([]raftpb.Entry{big}); err == nil {
			t.Fatal("an entry over the limit was taken")
		}
		if err := s.Append([]raftpb.Entry{{Index: 2, Term: 1, Data: e.Data}}); err != nil {
			t.Fatalf("append after a refused entry: %v", err)
		}
		_ = s.Close()
		mem.Crash()
		s = openOn(t, mem, opts)
		got := logOf(t, s)
		if len(got) != 3 || !bytes.Equal(got[1].Data, e.Data) || !bytes.Equal(got[2].Data, e.Data) {
			t.Fatalf("log%s", describe(got))
		}
		_ = s.Close()
	}
}
