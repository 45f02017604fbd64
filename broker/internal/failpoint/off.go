//go:build !failpoints

package failpoint

import "time"

// Enabled reports whether this binary was built with the failpoints tag.
const Enabled = false

// Inject acts at the named point when it is armed; without the tag it does nothing.
func Inject(string) {}

// Err acts at the named point like Inject and returns the injected error of an eio or
// enospc action; without the tag it returns nil.
func Err(string) error { return nil }

// Stall acts at the named point like Inject, but a sleep action sleeps by calling
// sleep; without the tag it does nothing.
func Stall(string, func(time.Duration)) {}

// ClockOffset is the shift of the wall clock set by ClockEnvVar; without the tag, zero.
func ClockOffset() time.Duration { return 0 }

// ClockDrift is how fast the wall clock set by ClockDriftEnvVar gains; without the tag,
// zero.
func ClockDrift() float64 { return 0 }
