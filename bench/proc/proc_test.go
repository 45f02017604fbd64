package proc

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestSampleOwnProcess(t *testing.T) {
	s := Sample(os.Getpid(), 10*time.Millisecond)
	deadline := time.Now().Add(200 * time.Millisecond)
	n := 0
	for time.Now().Before(deadline) {
		n++
	}
	u, ok := s.Stop()
	if !ok || u.CPU <= 0 || u.RSSPeak <= 0 || u.RSSLast <= 0 || u.RSSLast > u.RSSPeak {
		t.Fatalf("usage %+v ok %v after %d spins", u, ok, n)
	}
	if _, ok := Sample(0, time.Second).Stop(); ok {
		t.Fatal("a sampler of pid 0 reported usage")
	}
}

func TestStartWaitsForReadyAndStopEnds(t *testing.T) {
	calls := 0
	p, err := Start(exec.Command("sleep", "60"), io.Discard, 10*time.Second, func(context.Context) error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 3 {
		t.Fatalf("ready called %d times, want 3", calls)
	}
	pid := p.PID()
	p.Stop()
	p.Stop() // idempotent
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("process %d still runs after Stop", pid)
	}
}

func TestStartGivesUpOnAServerThatNeverGetsReady(t *testing.T) {
	_, err := Start(exec.Command("sleep", "60"), io.Discard, 200*time.Millisecond, func(context.Context) error {
		return errors.New("never")
	})
	if !errors.Is(err, ErrNotReady) {
		t.Fatalf("err %v, want ErrNotReady", err)
	}
	if _, err := Start(exec.Command("true"), io.Discard, 5*time.Second, func(context.Context) error {
		return errors.New("never")
	}); err == nil {
		t.Fatal("a process that exited was taken as ready")
	}
}
