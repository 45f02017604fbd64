package workload

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// segmentBytes lays out records the way Frames reads them: a 36-byte header (length
// first, offset at byte 12, key length at byte 28), no key, the value.
func segmentBytes(first uint64, values ...string) []byte {
	var b []byte
	for i, v := range values {
		f := make([]byte, 36+len(v))
		binary.LittleEndian.PutUint32(f, uint32(len(f)-4))
		binary.LittleEndian.PutUint64(f[12:], first+uint64(i))
		copy(f[36:], v)
		b = append(b, f...)
	}
	return b
}

// The cluster's corrupt step damages exactly one file of a stopped node the way a disk
// would: one bit inside what a record's CRC covers, never in its last record (so the
// damage is of an acknowledged record), or bytes appended past the last whole record;
// over seeds it reaches message logs, settle journals and Raft logs, and leaves what it
// set aside (damaged/) alone.
func TestDamageReplicaEditsOneFileAsADiskWould(t *testing.T) {
	kinds := map[string]int{}
	for seed := int64(1); seed <= 60; seed++ {
		dir := t.TempDir()
		part := filepath.Join(dir, "topics", "1-orders", "0")
		files := map[string][]byte{
			filepath.Join(part, "log", "00000000000000000000.log"):            segmentBytes(0, `{"id":"a"}`, `{"id":"b"}`, `{"id":"c"}`),
			filepath.Join(part, "journal", "00000000000000000000.log"):        segmentBytes(0, "\x01\x00", "\x01\x02"),
			filepath.Join(part, "raft", "00000000000000000001.raft"):          bytes.Repeat([]byte{7}, 100),
			filepath.Join(part, "damaged", "log", "00000000000000000000.log"): segmentBytes(0, `{"id":"x"}`, `{"id":"y"}`),
		}
		for p, b := range files {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		rel, detail := damageReplica(rand.New(rand.NewSource(seed)), dir)
		if rel == "" {
			t.Fatalf("seed %d: nothing damaged", seed)
		}
		changed := 0
		for p, before := range files {
			after, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Equal(before, after) {
				continue
			}
			changed++
			if got, _ := filepath.Rel(dir, p); got != rel {
				t.Errorf("seed %d: %s changed, the step says %s", seed, got, rel)
			}
			if strings.Contains(p, "damaged") {
				t.Errorf("seed %d: damaged a file set aside earlier", seed)
			}
			switch {
			case len(after) > len(before):
				if !bytes.HasPrefix(after, before) {
					t.Errorf("seed %d: a torn tail changed bytes before the end of %s", seed, rel)
				}
				kinds["torn "+filepath.Base(filepath.Dir(p))]++
			case len(after) == len(before):
				flipped, at := 0, -1
				for i := range before {
					if d := bits.OnesCount8(before[i] ^ after[i]); d > 0 {
						flipped += d
						at = i
					}
				}
				fs := Frames(before)
				last := fs[len(fs)-1]
				if flipped != 1 || at >= last.Pos || at < 8 {
					t.Errorf("seed %d: %d bits flipped, at byte %d of %s (its last record starts at %d): %s", seed, flipped, at, rel, last.Pos, detail)
				}
				for _, f := range fs {
					if at >= f.Pos && at < f.Pos+8 {
						t.Errorf("seed %d: flipped byte %d is in the length or CRC of a record", seed, at)
					}
				}
				kinds["flip "+filepath.Base(filepath.Dir(p))]++
			default:
				t.Errorf("seed %d: %s shrank", seed, rel)
			}
		}
		if changed != 1 {
			t.Errorf("seed %d: %d files changed, want 1", seed, changed)
		}
	}
	for _, k := range []string{"flip log", "flip journal", "torn log", "torn journal", "torn raft"} {
		if kinds[k] == 0 {
			t.Errorf("60 seeds never made a %s: %v", k, kinds)
		}
	}
	t.Logf("%v", kinds)
}
