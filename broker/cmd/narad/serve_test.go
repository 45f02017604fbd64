package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/broker"
)

// fakeUsers answers from scripted errors, one per call, then from its users.
type fakeUsers struct {
	seedErrs, readErrs []error
	users              int
	seeds, reads       int
}

func (f *fakeUsers) SeedAdmin(string) (bool, error) {
	f.seeds++
	if len(f.seedErrs) > 0 {
		err := f.seedErrs[0]
		f.seedErrs = f.seedErrs[1:]
		return false, err
	}
	return true, nil
}

func (f *fakeUsers) HasUsers() (bool, error) {
	f.reads++
	if len(f.readErrs) > 0 {
		err := f.readErrs[0]
		f.readErrs = f.readErrs[1:]
		return false, err
	}
	return f.users > 0, nil
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// A cluster node whose metadata lease lapsed between its start and the read of the
// users (the control plane's leader moved in a rolling restart) waits for the control
// plane instead of exiting: a soak run's restarted node once exited with "reading the
// users: unavailable", and the operator's rolling restart left the cluster a node short.
func TestSecurityOnWaitsOutAnUnavailableControlPlane(t *testing.T) {
	f := &fakeUsers{readErrs: []error{broker.ErrUnavailable, broker.ErrUnavailable}, users: 1}
	on, err := securityOn(context.Background(), config{HTTPAddr: "127.0.0.1:0"}, f, quiet)
	if err != nil {
		t.Fatalf("securityOn: %v", err)
	}
	if !on || f.reads != 3 {
		t.Fatalf("auth on %v after %d reads, want on after 3 (two unavailable, then the users)", on, f.reads)
	}
}

// Seeding the admin is tried again when its outcome is unknown (it is idempotent: a
// second seed finds the admin the first made).
func TestSecurityOnSeedsAgainAfterAnUnknownOutcome(t *testing.T) {
	f := &fakeUsers{seedErrs: []error{context.DeadlineExceeded}}
	on, err := securityOn(context.Background(), config{HTTPAddr: "127.0.0.1:0", AdminPassword: "correct horse battery"}, f, quiet)
	if err != nil || !on || f.seeds != 2 {
		t.Fatalf("securityOn = %v, %v after %d seeds; want on after 2", on, err, f.seeds)
	}
}

// Any other failure to read the users stops the node at once: taking it for "no users"
// would serve every topic without credentials.
func TestSecurityOnStopsOnOtherReadFailures(t *testing.T) {
	disk := errors.New("reading meta.db: input/output error")
	f := &fakeUsers{readErrs: []error{disk}}
	if _, err := securityOn(context.Background(), config{HTTPAddr: "127.0.0.1:0"}, f, quiet); !errors.Is(err, disk) || f.reads != 1 {
		t.Fatalf("securityOn = %v after %d reads, want the disk error after 1", err, f.reads)
	}
}

// A stop requested while the control plane stays unavailable ends the wait.
func TestSecurityOnEndsWithItsContext(t *testing.T) {
	errs := make([]error, 1000)
	for i := range errs {
		errs[i] = broker.ErrUnavailable
	}
	f := &fakeUsers{readErrs: errs}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := securityOn(ctx, config{HTTPAddr: "127.0.0.1:0"}, f, quiet)
	if !errors.Is(err, broker.ErrUnavailable) || ctx.Err() == nil {
		t.Fatalf("securityOn = %v (context %v), want unavailable once the context ended", err, ctx.Err())
	}
}

// Without users, a node refuses a non-loopback address unless told --insecure.
func TestSecurityOnRefusesAnOpenNonLoopbackAddress(t *testing.T) {
	if _, err := securityOn(context.Background(), config{HTTPAddr: "0.0.0.0:7000"}, &fakeUsers{}, quiet); err == nil {
		t.Fatal("securityOn served 0.0.0.0 with no users and no --insecure")
	}
	if on, err := securityOn(context.Background(), config{HTTPAddr: "0.0.0.0:7000", Insecure: true}, &fakeUsers{}, quiet); err != nil || on {
		t.Fatalf("securityOn with --insecure = %v, %v; want off, nil", on, err)
	}
}

// TestFailStop: a failure of the write-ahead file ends the process with status 74 and
// an ERROR line naming the cause; the end of serve ends the watch without an exit.
func TestFailStop(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	failed := make(chan error, 1)
	exited := make(chan int, 1)
	done := make(chan struct{})
	go func() { failStop(failed, make(chan struct{}), log, func(code int) { exited <- code }); close(done) }()
	failed <- errors.New("wal: failed closed: fdatasync: input/output error")
	select {
	case code := <-exited:
		if code != 74 {
			t.Fatalf("exit status %d, want 74", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after the write-ahead file failed")
	}
	<-done
	if s := logs.String(); !strings.Contains(s, "level=ERROR") || !strings.Contains(s, "input/output error") {
		t.Fatalf("log %q", s)
	}

	served := make(chan struct{})
	done = make(chan struct{})
	go func() { failStop(make(chan error), served, log, func(code int) { exited <- code }); close(done) }()
	close(served)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch outlived serve")
	}
	if len(exited) != 0 {
		t.Fatalf("exited with %d at the end of serve", <-exited)
	}
}
