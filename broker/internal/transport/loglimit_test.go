package transport

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLogLimiterLetsABurstThroughThenCountsWhatItDrops(t *testing.T) {
	var buf bytes.Buffer
	l := newLogLimiter(slog.New(slog.NewTextHandler(&buf, nil)), time.Hour, 3)
	for range 10 {
		l.Warn("handshake failed")
	}
	if got := strings.Count(buf.String(), "handshake failed"); got != 3 {
		t.Fatalf("%d lines from a burst of 10 with a burst limit of 3:\n%s", got, buf.String())
	}
	// An interval later one more line goes through and reports the 7 it dropped.
	l.mu.Lock()
	l.last = l.last.Add(-time.Hour)
	l.mu.Unlock()
	buf.Reset()
	l.Warn("handshake failed")
	if !strings.Contains(buf.String(), "suppressed=7") {
		t.Fatalf("the next line does not report the dropped ones: %q", buf.String())
	}
}
