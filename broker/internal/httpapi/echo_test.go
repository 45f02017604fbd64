package httpapi

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestElideAndClip(t *testing.T) {
	t.Parallel()
	long := "start " + strings.Repeat("é", 5000) + " end"
	e := elide(long, 100)
	if len(e) > 110 || !utf8.ValidString(e) || !strings.HasPrefix(e, "start ") || !strings.HasSuffix(e, " end") || !strings.Contains(e, "…") {
		t.Errorf("elide: %q (%d bytes)", e, len(e))
	}
	if elide("short", 100) != "short" {
		t.Error("elide changed a short message")
	}
	c := clip(strings.Repeat("é", 300), maxEcho)
	if len(c) > maxEcho+len("…") || !utf8.ValidString(c) || !strings.HasSuffix(c, "…") {
		t.Errorf("clip: %q (%d bytes)", c, len(c))
	}
}
