package main

import (
	"runtime/debug"
	"testing"
)

// The collector's target stays at the ceiling while the live heap is small and comes
// down, never below 100, as the heap grows past what gcHeadroom allows.
func TestGCTarget(t *testing.T) {
	for _, tc := range []struct {
		max  int
		live uint64
		want int
	}{
		{400, 0, 400},
		{400, 16 << 20, 400},           // 128 MiB of headroom is 800 %
		{400, 32 << 20, 400},           // exactly 400 %
		{400, 64 << 20, 200},           // at most 128 MiB more
		{400, 100 << 20, 128},          // 128 %
		{400, 256 << 20, 100},          // never under Go's default
		{400, 4 << 30, 100},            //
		{50, 4 << 30, 50},              // a ceiling under 100 is kept
		{1000, 64 << 20, 200},          //
		{150, 16 << 20, 150},           // the ceiling wins when lower
		{400, (128 << 20) / 3, 300},    // 300 %
		{400, (128<<20)/3 + 1000, 299}, // rounds down: never more than the headroom
		{10000, 1 << 20, 10000},        //
		{400, 1<<64 - 1, 100},          // a live heap too large to multiply
	} {
		if got := gcTarget(tc.max, tc.live); got != tc.want {
			t.Errorf("gcTarget(%d, %d) = %d, want %d", tc.max, tc.live, got, tc.want)
		}
	}
}

// apply gives the runtime the target it computes.
func TestGCTunerSetsTheTarget(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	got := newGCTuner(400).apply()
	if got < 100 || got > 400 {
		t.Fatalf("apply chose %d, outside 100 to 400", got)
	}
	if now := debug.SetGCPercent(100); now != got {
		t.Fatalf("the runtime's target is %d, the tuner chose %d", now, got)
	}
}
