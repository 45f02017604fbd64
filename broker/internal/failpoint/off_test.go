//go:build !failpoints

package failpoint

import "testing"

func TestOffIsInert(t *testing.T) {
	t.Setenv(EnvVar, "segment-after-write:kill")
	Inject(SegmentAfterWrite)
	if Enabled || Err(SegmentAfterWrite) != nil {
		t.Fatal("a build without the failpoints tag acted at a point")
	}
}
