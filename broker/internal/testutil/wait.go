package testutil

import (
	"testing"
	"time"
)

// Poll calls cond until it returns true or timeout passes, starting at a 10 ms interval
// and backing off to 100 ms. It reports whether cond became true.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	delay := 10 * time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(delay)
		if delay < 100*time.Millisecond {
			delay = delay * 3 / 2
		}
	}
}

// WaitFor polls cond like Poll and fails the test (t.Fatalf) when it does not become
// true within timeout; what says what was awaited. Call it from the test goroutine.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	if !Poll(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", time.Since(start).Round(time.Millisecond), what)
	}
}
