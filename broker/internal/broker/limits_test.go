package broker

import (
	"testing"
	"time"
)

// TestShortDuration pins how messages spell the duration limits: a change here changes
// what clients read in a 400.
func TestShortDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		MaxVisibility:           "12h",
		MaxWait:                 "20s",
		MinVisibility:           "100ms",
		90 * time.Minute:        "1h30m",
		time.Hour + time.Second: "1h0m1s",
		2 * time.Minute:         "2m",
	} {
		if got := ShortDuration(d); got != want {
			t.Errorf("ShortDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
