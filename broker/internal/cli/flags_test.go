package cli

import (
	"strings"
	"testing"
)

// TestFlagsRefuseNumbersOutOfRange: a negative number or duration, a --timeout of 0 and
// a --rate no ticker can pace are usage errors (exit 2, the flag named on stderr), and
// nothing reaches the broker. They used to be read as "not given" (--partitions -3
// created the broker's default, --partition -2 picked one by key, --max -1 consumed
// nothing and exited 0), or to panic (--rate 1e12).
func TestFlagsRefuseNumbersOutOfRange(t *testing.T) {
	f := &fakeAPI{answers: map[string]fakeAnswer{}}
	for _, args := range [][]string{
		{"topic", "create", "t", "--partitions", "-3"},
		{"topic", "create", "t", "--visibility", "-5s"},
		{"topic", "alter", "t", "--retention", "-1h"},
		{"topic", "alter", "t", "--max-in-flight", "-1"},
		{"consume", "t", "--max", "-1"},
		{"replay", "t", "--max", "-1"},
		{"replay", "t", "--partition", "-2"},
		{"replay", "t", "--partition", "0", "--from", "5", "--to", "-3"},
		{"produce", "t", "x", "--partition", "-2"},
		{"produce", "t", "x", "--rate", "1e12"},
		{"produce", "t", "x", "--rate", "1e-12"},
		{"produce", "t", "x", "--rate", "NaN"},
		{"topic", "list", "--timeout", "0"},
		{"topic", "list", "--timeout", "-1s"},
		{"bench", "t", "--partitions", "-1"},
	} {
		r := runAgainst(t, f, args...)
		flagName := ""
		for _, a := range args {
			if strings.HasPrefix(a, "--") {
				flagName = a
			}
		}
		if r.code != ExitUsage || !strings.Contains(r.stderr, flagName) {
			t.Errorf("%v: exit %d, want %d naming %s; stderr %q", args, r.code, ExitUsage, flagName, r.stderr)
		}
	}
	if got := f.sent(); len(got) != 0 {
		t.Errorf("sent to the broker: %q", got)
	}
}
