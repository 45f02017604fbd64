package node

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestParseSkip(t *testing.T) {
	for line, want := range map[string]Skip{
		`time=2026-12-01T10:00:00.000Z level=ERROR msg="a damaged message is skipped: it is never delivered and counts as settled" topic=work partition=2 partition=2 offset=417 err="partition: ..."`:      {Log: "log", Topic: "work", Partition: 2, Offset: 417},
		`time=2026-12-01T10:00:00.000Z level=ERROR msg="a damaged message is skipped by fan-out: it is never copied" topic=orders partition=3 offset=88 child=orders.later err="x"`:                         {Log: "fanout", Topic: "orders", Child: "orders.later", Partition: 3, Offset: 88},
		`time=2026-12-01T10:00:00.000Z level=ERROR msg="a damaged settle record is skipped; the messages it settled will be delivered again" topic="we ird" partition=0 partition=0 journal_offset=9 err=x`: {Log: "journal", Topic: "we ird", Partition: 0, Offset: -1},
	} {
		got, ok := parseSkip(line)
		if !ok || got != want {
			t.Errorf("parseSkip(%q) = %+v, %v; want %+v", line, got, ok, want)
		}
	}
	if _, ok := parseSkip(`level=ERROR msg="damaged records found on open" topic=t partition=0`); ok {
		t.Error("a line that is no skip was taken for one")
	}
}

func TestParseLead(t *testing.T) {
	for line, want := range map[string]Lead{
		`time=2026-12-06T01:00:00.000Z level=INFO msg="leading partition" topic=events incarnation=3 partition=0 term=16 by=handover`: {Topic: "events", Incarnation: 3, Partition: 0, Term: 16, How: "handover"},
		`time=2026-12-06T01:00:00.000Z level=INFO msg="leading partition" topic="a b" incarnation=1 partition=4 term=2 by=election`:   {Topic: "a b", Incarnation: 1, Partition: 4, Term: 2, How: "election"},
	} {
		got, ok := parseLead(line)
		if !ok || got != want {
			t.Errorf("parseLead(%q) = %+v, %v; want %+v", line, got, ok, want)
		}
	}
	for _, line := range []string{
		`level=INFO msg="leading partition" topic=t partition=0 term=2 by=election`, // no incarnation: an older build
		`level=INFO msg="leaving partition" topic=t incarnation=1 partition=0 term=2 by=election`,
	} {
		if _, ok := parseLead(line); ok {
			t.Errorf("parseLead(%q) took it for a leading line", line)
		}
	}
}

// A cluster replica that skipped damaged records and then set its data aside to be
// rebuilt from its group reports none of those skips: the checker must then find
// every message intact. Skips of other partitions stay.
func TestRebuildDropsTheReplicasSkips(t *testing.T) {
	logf, err := os.Create(filepath.Join(t.TempDir(), "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	n := &Node{log: logf}
	r, w := io.Pipe()
	done := make(chan struct{})
	go n.copyStderr(r, done)
	for _, line := range []string{
		`time=x level=ERROR msg="a damaged settle record is skipped; the messages it settled will be delivered again" topic=orders.later partition=0 partition=0 journal_offset=40 err=x`,
		`time=x level=ERROR msg="a damaged message is skipped: it is never delivered and counts as settled" topic=orders partition=1 partition=1 offset=7 err=x`,
		`time=x level=ERROR msg="a replica's data is damaged; it is set aside in damaged/ and rebuilt from the partition's group" topic=orders.later partition=0 damaged_records=0 damaged_settle_records=1`,
		`time=x level=ERROR msg="a damaged message is skipped: it is never delivered and counts as settled" topic=orders partition=2 partition=2 offset=9 err=x`,
		`time=x level=ERROR msg="a replica met a damaged record or failed a write while serving; it is set aside in damaged/ and rebuilt from the partition's group" topic=orders partition=2`,
	} {
		if _, err := io.WriteString(w, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	_ = w.Close()
	<-done
	got := n.TakeSkips()
	want := []Skip{{Log: "log", Topic: "orders", Partition: 1, Offset: 7}}
	if len(got) != 1 || got[0] != want[0] {
		t.Errorf("skips after the rebuilds: %+v, want %+v", got, want)
	}
}
