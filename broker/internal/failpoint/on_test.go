//go:build failpoints

package failpoint

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestSetAndHits(t *testing.T) {
	t.Cleanup(func() { Set("") })
	if err := Set("a:eio@2; b:sleep(1ms);c:enospc;d:eio@2+"); err != nil {
		t.Fatal(err)
	}
	if err := Err("a"); err != nil {
		t.Fatalf("first hit of a@2: %v", err)
	}
	if err := Err("a"); !errors.Is(err, syscall.EIO) || !errors.Is(err, ErrInjected) {
		t.Fatalf("second hit of a@2: %v", err)
	}
	if err := Err("a"); err != nil {
		t.Fatalf("third hit of a@2: %v", err)
	}
	Inject("c") // an error action is ignored by Inject
	if err := Err("c"); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("c: %v", err)
	}
	for i, want := range []bool{false, true, true, true} {
		if err := Err("d"); errors.Is(err, syscall.EIO) != want {
			t.Fatalf("hit %d of d@2+: %v", i+1, err)
		}
	}
	Inject("b")
	if Hits("a") != 3 || Hits("b") != 1 || Hits("nope") != 0 {
		t.Fatalf("hits a=%d b=%d", Hits("a"), Hits("b"))
	}
	for _, bad := range []string{"x", "x:boom", "x:kill@0", "x:kill@0+", "x:kill@+", "x:kill@2++", "x:sleep(zz)", ":kill"} {
		if Set(bad) == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}

// The fired line's mono_nano is CLOCK_MONOTONIC: it moves with Go's monotonic clock.
func TestMonoNanosFollowsTheMonotonicClock(t *testing.T) {
	start, m0 := time.Now(), monoNanos()
	if m0 <= 0 {
		t.Fatalf("monoNanos() = %d", m0)
	}
	time.Sleep(50 * time.Millisecond)
	got, want := time.Duration(monoNanos()-m0), time.Since(start)
	if d := got - want; d < -5*time.Millisecond || d > 5*time.Millisecond {
		t.Fatalf("monoNanos advanced %v while time.Since says %v", got, want)
	}
}

// TestFileArmsAndDisarms: the file named by FileEnvVar replaces the armed points when
// its content changes, and an empty file disarms them; a spec that does not parse
// leaves them as they were.
func TestFileArmsAndDisarms(t *testing.T) {
	t.Cleanup(func() { Set("") })
	if err := Set("a:eio"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "fp")
	go pollFile(path, time.Millisecond)
	time.Sleep(20 * time.Millisecond) // no file yet: what Set armed stays
	if err := Err("a"); err == nil {
		t.Fatal("a missing file disarmed the points")
	}
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path+".tmp", []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not within 10 s", what)
			}
		}
	}
	write("b:enospc\n")
	wait("the file's point armed", func() bool { return errors.Is(Err("b"), syscall.ENOSPC) })
	if err := Err("a"); err != nil {
		t.Fatalf("the file's content did not replace the points armed before: %v", err)
	}
	write("b:boom")
	time.Sleep(20 * time.Millisecond)
	if !errors.Is(Err("b"), syscall.ENOSPC) {
		t.Fatal("a spec that does not parse changed the points")
	}
	write("")
	wait("an empty file to disarm every point", func() bool { return Err("b") == nil })
}
