package node

import "testing"

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
