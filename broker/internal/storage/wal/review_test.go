package wal

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// zeroRange damages name on "disk": bytes [off, off+n) read as zeros, as a sector
// the disk lost or returns zeroed would.
func zeroRange(t *testing.T, m *vfs.Mem, name string, off, n int64) {
	t.Helper()
	b, err := m.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	for i := off; i < off+n; i++ {
		if b[i] != 0 {
			if err := m.FlipByte(name, i, b[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestADamagedRecordHeaderSkipsNoValidRecord: a record whose whole 16-byte header is
// damaged (its length and its sequence both: a sector lost or read back as zeros)
// ended the replay of its write-ahead file without a word, dropping every record
// after it, of every partition and Raft log of the node. The records after it are
// the only copy of acknowledged writes once a power loss took their data files'
// unsynced pages. No record of the use can be forged, so the first valid record of
// the use after the damaged one is where the replay goes on, as it does when only
// the length is damaged.
func TestADamagedRecordHeaderSkipsNoValidRecord(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 0)
	names := []string{"t/a.log", "t/b.log", "t/c.log", "t/d.log"}
	data := bytes.Repeat([]byte{'x'}, 64-recHeaderLen-2-len("t/a.log")-8) // records of 64 bytes
	for _, n := range names {
		write(t, w, dataFile(t, m, n), n, 0, data)
	}
	zeroRange(t, m, filepath.Join(walDir, "00000000.wal"), headerLen, recHeaderLen)
	m.Crash()
	_, rep := open(t, m, 0)
	for _, n := range names[1:] {
		if got := content(t, m, n); !bytes.Equal(got, data) {
			t.Errorf("%s = %q after replay (%+v): an acknowledged record after the damaged one was dropped", n, got, rep)
		}
	}
	if rep.Damaged != 1 || rep.Records != 3 {
		t.Fatalf("replayed %+v, want 3 records and 1 damaged", rep)
	}
}
