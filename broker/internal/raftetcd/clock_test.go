package raftetcd

import (
	"testing"
	"time"
)

// TestClockOffsetIsOfTheStampingClock: the peer clock offsets (the metric an operator
// watches for skew) are measured on the clock each node stamps records with
// (Options.WallClock), not on the machine's: a node whose stamping clock kept the
// machine's time of its start while the machine's clock was stepped (a paused and
// resumed virtual machine) stamps records seconds off its peers, and its offset must
// say so. Here node 2's stamping clock runs 5 s ahead of the machine's.
func TestClockOffsetIsOfTheStampingClock(t *testing.T) {
	const ahead = 5 * time.Second
	ns := startClusterWith(t, 1, func(o *Options) {
		if o.ID == 2 {
			o.WallClock = func() int64 { return time.Now().Add(ahead).UnixNano() }
		}
	})
	near := func(d, want time.Duration) bool {
		return d > want-500*time.Millisecond && d < want+500*time.Millisecond
	}
	poll(t, 10*time.Second, "node 1 to measure node 2 5 s ahead and node 3 level", func() bool {
		offs := ns[0].host.ClockOffsets()
		return near(offs[2], ahead) && near(offs[3], 0)
	})
	poll(t, 10*time.Second, "node 2 to measure node 1 5 s behind", func() bool {
		return near(ns[1].host.ClockOffsets()[1], -ahead)
	})
}
