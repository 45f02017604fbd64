//go:build bugs

package scenario

// BUG tests: each fails against the broker as it is; run them from verify/ with
// `go test -tags bugs -run TestBug -v ./scenario/`.

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BUG: one record that fails its CRC makes every good message leased in the same run
// of consecutive offsets undeliverable, for good. partition.Lease reads a run of
// consecutive leased offsets with one readRun; when the run hits the damaged record it
// drops the whole run (also the records read before the damage, which readRun returned)
// and leaves all of them leased; when the leases lapse, the lowest ready offsets are
// leased again first — the same run — and fail again. With consume-batch max=100 and a
// damaged record at offset ~70, offsets 0..~60 (and more) are never delivered and the
// frontier never passes them (partition.go, Lease: `recs, err := p.readRun(...)`, `i = j;
// continue`). Expected: the good records of the run are delivered, only the damaged one
// is held back.
func TestBugCorruptRecordBlocksBatch(t *testing.T) {
	corruptSealed(t, 100, 500, 15*time.Second)
}

// BUG: replaying a record whose CRC fails (bit rot in a sealed segment) answers
// 500 internal, "an unexpected error happened; please report it", and the message
// carries the server's file path (…/topics/4-c/0/log/000…061.log at offset 70). The
// broker detects the damage correctly and serves nothing wrong, but a damaged disk is
// not a bug to report, 500 is not in the documented set for replay, and the path should
// stay in the log. Expected: a documented 5xx code (e.g. 503 storage_failed or a new
// data_corrupt) whose message names the partition and offset only.
func TestBugCorruptRecordIs500(t *testing.T) {
	data := t.TempDir()
	n := startNode(t, data, "--segment-bytes", "65536")
	call(t, "POST", n.URL()+"/v1/topics", []byte(`{"name":"c","partitions":1}`))
	for i := 0; i < 200; i++ {
		call(t, "POST", n.URL()+"/v1/topics/c/produce", []byte(fmt.Sprintf(`{"id":"m-%d","pad":"%s"}`, i, strings.Repeat("p", 1000))))
	}
	n.Kill()
	seg := ""
	filepath.WalkDir(data, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, "/log/00000000000000000000.log") {
			seg = p
		}
		return nil
	})
	b, _ := os.ReadFile(seg)
	b[500] ^= 0xff // inside record 0's value
	os.WriteFile(seg, b, 0o644)
	n.Start()
	if err := n.WaitReady(30e9); err != nil {
		t.Fatal(err)
	}
	a := call(t, "GET", n.URL()+"/v1/topics/c/consume?partition=0&offset=0", nil)
	if a.status == 500 || a.code == "internal" || strings.Contains(string(a.body), data) {
		t.Fatalf("a corrupt record answers %d %s", a.status, a.body)
	}
}

// BUG (data loss): a few flipped bits in the metadata store (meta/raft.db) can make a
// node start with a different topic set and then delete topic data. bbolt keeps no
// checksum of its values and the Raft log entries carry none either, so a flip inside a
// create_topic command's JSON that still decodes changes a topic silently: a partition
// count of 0, an incarnation of 0, a name of "". On start the broker then removes the
// data directory of the topic it no longer knows (seen: "5-beta" deleted and "0-beta"
// created empty; "7-delta" deleted and "7-" created). RELIABILITY.md C17 asks that a
// node with a corrupt metadata store refuse to start with a clear error; A7 that
// destructive steps wait until the node knows it is current. Other flips end in panics
// (msgpack decode, a nil pointer in fsm.apply) rather than a clear error. Expected: a
// checksum over each stored command (or snapshot) checked on read, and no deletion of
// topic directories on the word of an unverified store.
func TestBugMetadataBitFlip(t *testing.T) {
	topics := []string{"alpha", "beta", "gamma", "delta"}
	for seed := int64(1); seed <= 60; seed++ {
		data := t.TempDir()
		n := startNode(t, data)
		for _, name := range topics {
			call(t, "POST", n.URL()+"/v1/topics", []byte(`{"name":"`+name+`","partitions":2}`))
			call(t, "POST", n.URL()+"/v1/topics/"+name+"/produce", []byte(`{"id":"x"}`))
		}
		before := topicDirs(t, data)
		n.Kill()
		flipMeta(t, filepath.Join(data, "meta", "raft.db"), seed)
		n.Start()
		err := n.WaitReady(10 * time.Second)
		if err != nil {
			n.Kill()
			continue // refused to start: what C17 asks for (the message quality aside)
		}
		time.Sleep(time.Second) // let reconcile run
		after := topicDirs(t, data)
		a := call(t, "GET", n.URL()+"/v1/topics", nil)
		n.Kill()
		if strings.Join(before, " ") != strings.Join(after, " ") {
			t.Fatalf("seed %d: after 3 bit flips in raft.db the node started and its topic directories went from %v to %v; GET /v1/topics: %s", seed, before, after, a.body)
		}
	}
}

func topicDirs(t *testing.T, data string) []string {
	ents, _ := os.ReadDir(filepath.Join(data, "topics"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// flipMeta flips 3 bits at random non-zero bytes of the file (pages in use).
func flipMeta(t *testing.T, path string, seed int64) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var used []int
	for i, c := range b {
		if c != 0 {
			used = append(used, i)
		}
	}
	r := rand.New(rand.NewSource(seed))
	for k := 0; k < 3; k++ {
		i := used[r.Intn(len(used))]
		b[i] ^= 1 << r.Intn(8)
	}
	os.WriteFile(path, b, 0o644)
}
