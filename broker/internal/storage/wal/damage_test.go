package wal

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestADamagedRecordIsSkippedNotTheRestOfTheFile: one record of a write-ahead file
// whose bytes rotted (a bit flip in its data) must not take every record after it
// with it. The records that follow belong to other partitions and Raft logs of the
// node (a 202'd message, a 204'd ack, an entry or a vote acknowledged to a leader);
// after a power loss that left their data files without them, the write-ahead file
// is their only copy. The damaged record is skipped (its own data file then shows
// the hole, which the segment log reports as damage), counted, and the records
// after it are redone. Before, replay stopped at the damaged record without a word,
// and b.log's acknowledged write was lost.
func TestADamagedRecordIsSkippedNotTheRestOfTheFile(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 0)
	a, b := dataFile(t, m, "t/a.log"), dataFile(t, m, "t/b.log")
	write(t, w, a, "t/a.log", 0, []byte("aaaaa"))
	write(t, w, b, "t/b.log", 0, []byte("bbbbb"))
	write(t, w, a, "t/a.log", 5, []byte("AAAAA"))
	// The first record: header, path length, "t/a.log", offset, then its data.
	dataAt := int64(headerLen + recHeaderLen + 2 + len("t/a.log") + 8)
	if err := m.FlipByte(filepath.Join(walDir, "00000000.wal"), dataAt+1, 0x40); err != nil {
		t.Fatal(err)
	}
	m.Crash()
	_, rep := open(t, m, 0)
	if got := string(content(t, m, "t/b.log")); got != "bbbbb" {
		t.Fatalf("b.log = %q after replay (%+v): a damaged record of another file dropped its acknowledged write", got, rep)
	}
	if got := content(t, m, "t/a.log"); len(got) != 10 || string(got[5:]) != "AAAAA" || string(got[:5]) == "aaaaa" {
		t.Fatalf("a.log = %q after replay: want the damaged record's bytes missing and the later record redone", got)
	}
	if rep.Damaged != 1 || rep.Records != 2 {
		t.Fatalf("replayed %+v, want 2 records redone and 1 damaged record counted", rep)
	}
	// Replay freed the file: nothing is counted again at the next start.
	m.Crash()
	if _, rep := open(t, m, 0); rep.Damaged != 0 || rep.Records != 0 {
		t.Fatalf("second start replayed %+v, want nothing", rep)
	}
}

// TestTheEndOfAUseIsNotDamage: the ends a replay meets normally (zeros of a new file,
// a record of an earlier use of a reused file) are not counted as damage.
func TestTheEndOfAUseIsNotDamage(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 0)
	a := dataFile(t, m, "t/a.log")
	for i := range 20 {
		write(t, w, a, "t/a.log", int64(i*5), []byte("aaaaa"))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// The next life reuses the file: its one record is followed by the earlier use's.
	w, _ = open(t, m, 0)
	write(t, w, a, "t/a.log", 100, []byte("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"))
	m.Crash()
	if _, rep := open(t, m, 0); rep.Damaged != 0 || rep.Records != 1 {
		t.Fatalf("replayed %+v, want 1 record and no damage", rep)
	}
}

// TestADamagedLengthSkipsNoValidRecord: when the damage is in a record's length, the
// length leads past the records after it (a flipped bit adds 128 bytes: two records of
// 64). Skipping by the damaged length dropped those two valid records as well; the
// replay looks for the first valid record of the use after the damaged one instead.
func TestADamagedLengthSkipsNoValidRecord(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 0)
	names := []string{"t/a.log", "t/b.log", "t/c.log", "t/d.log"}
	data := bytes.Repeat([]byte{'x'}, 64-recHeaderLen-2-len("t/a.log")-8) // records of 64 bytes
	for _, n := range names {
		write(t, w, dataFile(t, m, n), n, 0, data)
	}
	if err := m.FlipByte(filepath.Join(walDir, "00000000.wal"), headerLen, 0x80); err != nil {
		t.Fatal(err)
	}
	m.Crash()
	_, rep := open(t, m, 0)
	for _, n := range names[1:] {
		if got := content(t, m, n); !bytes.Equal(got, data) {
			t.Errorf("%s = %q after replay (%+v): a valid record after the damaged one was skipped", n, got, rep)
		}
	}
	if rep.Damaged != 1 || rep.Records != 3 {
		t.Fatalf("replayed %+v, want 3 records and 1 damaged", rep)
	}
}

// TestARottedHeaderDoesNotHideAUseInProgress: the header of a file in use rotted at
// rest (one flipped bit) before a power loss. Its records are the only copy of
// acknowledged writes whose data files were not synced yet; the replay took the file
// for free and redid none of them, without a word. The first record after the header
// tells the use now (firstUse): the records are redone, and the header is counted.
func TestARottedHeaderDoesNotHideAUseInProgress(t *testing.T) {
	m := vfs.NewMem()
	helloWorld(t, m)
	if err := m.FlipByte(filepath.Join(walDir, "00000000.wal"), 13, 0x01); err != nil {
		t.Fatal(err)
	}
	m.Crash()
	_, rep := open(t, m, 0)
	if got := string(content(t, m, "t/a.log")); got != "hello world" {
		t.Fatalf("a.log = %q after replay (%+v): a rotted header hid the acknowledged writes of its file", got, rep)
	}
	if got := string(content(t, m, "t/b.log")); got != "other" {
		t.Fatalf("b.log = %q after replay (%+v)", got, rep)
	}
	if rep.DamagedHeaders != 1 || rep.FirstDamagedHeader == "" || rep.Records != 3 {
		t.Fatalf("replayed %+v, want 3 records and 1 damaged header named", rep)
	}
	// The replay freed the file with a valid header: nothing is counted again.
	m.Crash()
	if _, rep := open(t, m, 0); rep.DamagedHeaders != 0 || rep.Records != 0 {
		t.Fatalf("second start replayed %+v, want nothing", rep)
	}
}

// TestARottedHeaderOfAFreedFileIsNotReplayed: the header of a file a checkpoint freed
// rots; its old records must stay unread, since their data file was cut and written
// anew since (as a Raft log's cut does, after a checkpoint). freeFile zeroes the first
// record's header when it frees a file, so the file reads as free.
func TestARottedHeaderOfAFreedFileIsNotReplayed(t *testing.T) {
	m := vfs.NewMem()
	w, _ := open(t, m, 0)
	f := dataFile(t, m, "r.log")
	write(t, w, f, "r.log", 0, []byte("old-old"))
	if err := w.Checkpoint(); err != nil { // file 0 freed
		t.Fatal(err)
	}
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("new"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := m.FlipByte(filepath.Join(walDir, "00000000.wal"), 13, 0x01); err != nil {
		t.Fatal(err)
	}
	m.Crash()
	_, rep := open(t, m, 0)
	if got := string(content(t, m, "r.log")); got != "new" {
		t.Fatalf("r.log = %q after replay (%+v): the records of a freed file were replayed over newer data", got, rep)
	}
	if rep.DamagedHeaders != 0 {
		t.Fatalf("replayed %+v: a freed file counted as a damaged header of a use", rep)
	}
}
