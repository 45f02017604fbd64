package partition

import (
	"encoding/binary"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestADamagedWALRecordIsOneDamagedMessage: a record of the write-ahead file that
// rotted (one byte of a message's bytes) after three appends were answered, then a
// power loss that left the log file without them. The replay skips the damaged record
// and redoes the ones after it; the partition finds the hole where the message was,
// skips it, counts it (the single-node rule), and delivers the message after it.
// Before, the replay stopped at the damaged record without a word, and the third
// answered message was lost with it, uncounted.
func TestADamagedWALRecordIsOneDamagedMessage(t *testing.T) {
	fs := vfs.NewMem()
	w, _ := openWAL(t, fs)
	p := mustOpen(t, fs, func(o *Options) { o.WAL = w })
	for _, v := range []string{"first", "second", "third"} {
		if _, err := p.Append([]segment.Record{{Value: []byte(v)}}); err != nil {
			t.Fatal(err)
		}
	}
	// The second record of the write-ahead file is the second message's: flip a byte
	// of its last bytes (the message's value).
	name := "/wal/00000000.wal"
	b, err := fs.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	pos := 32
	pos += 16 + int(binary.LittleEndian.Uint32(b[pos:]))
	end := pos + 16 + int(binary.LittleEndian.Uint32(b[pos:]))
	if err := fs.FlipByte(name, int64(end-2), 0x20); err != nil {
		t.Fatal(err)
	}
	fs.Crash()
	_ = p.closeFiles()

	_, rep := openWAL(t, fs)
	var damaged int
	p = mustOpen(t, fs, func(o *Options) { o.OnDamaged = func(_ string, n int) { damaged += n } })
	defer p.Close()
	var got []string
	for _, d := range leaseAll(t, p) {
		got = append(got, string(d.Record.Value))
	}
	if len(got) != 2 || got[0] != "first" || got[1] != "third" {
		t.Fatalf("delivered %q after the replay %+v; want first and third (the second damaged)", got, rep)
	}
	if rep.Damaged != 1 {
		t.Fatalf("replay %+v: want one damaged record counted", rep)
	}
	if logDamage, _ := p.Damage(); logDamage != 1 && damaged != 1 {
		t.Fatalf("the damaged message was not counted (Damage %d, OnDamaged %d)", logDamage, damaged)
	}
}
