package narad

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestKindOfMapsEveryStatus(t *testing.T) {
	// stops: the consume loop stops on it (contract rules 7 and 8: 401, 403, the topic
	// gone, and a request the broker refuses as sent: 400, 409, 413); every other
	// failure is retried.
	cases := []struct {
		status                   int
		code                     string
		kind                     error
		retryable, unsure, stops bool
	}{
		{400, "invalid_parameter", ErrBadRequest, false, false, true},
		{401, "unauthenticated", ErrUnauthenticated, false, false, true},
		{403, "forbidden", ErrForbidden, false, false, true},
		{404, "topic_not_found", ErrNotFound, false, false, true},
		{408, "", ErrTimeout, true, true, false},
		{409, "topic_exists", ErrConflict, false, false, true},
		{410, "lease_lost", ErrLeaseLost, false, false, false},
		{413, "payload_too_large", ErrTooLarge, false, false, true},
		{429, "", ErrThrottled, true, false, false},
		{501, "not_implemented", ErrNotImplemented, false, false, false},
		{503, "unavailable", ErrUnavailable, true, false, false},
		{503, "acked_ahead_full", ErrUnavailable, true, false, false},
		{503, "timeout", ErrTimeout, true, true, false},
		{504, "", ErrTimeout, true, true, false},
		{500, "internal", ErrInternal, false, false, false},
	}
	for _, c := range cases {
		e := &Error{Op: "x", Status: c.status, Code: c.code, kind: kindOf(c.status, c.code), uncertain: c.unsure}
		wrapped := fmt.Errorf("outer: %w", e)
		if !errors.Is(wrapped, c.kind) || Retryable(wrapped) != c.retryable || Uncertain(wrapped) != c.unsure {
			t.Errorf("%d %s: kind %v retryable %v uncertain %v", c.status, c.code, e.kind, Retryable(wrapped), Uncertain(wrapped))
		}
		if terminal(e) != c.stops {
			t.Errorf("%d %s: terminal %v", c.status, c.code, terminal(e))
		}
	}
	// A produce-batch request that was partly stored is not to be resent.
	part := &Error{Op: "produce-batch", Status: 503, Code: CodeStorageFailed, kind: ErrUnavailable, uncertain: true,
		PartlyStored: &PartlyStored{Stored: 3, FailedPartitions: []int32{0, 2}}}
	if Retryable(part) || !Uncertain(part) || terminal(part) {
		t.Errorf("partly stored: retryable %v uncertain %v terminal %v", Retryable(part), Uncertain(part), terminal(part))
	}
	if Retryable(nil) || Uncertain(nil) || Retryable(errors.New("x")) {
		t.Fatal("foreign errors")
	}
	cancelled := &Error{Op: "x", Err: context.Canceled}
	if !errors.Is(cancelled, context.Canceled) || Retryable(cancelled) || terminal(cancelled) {
		t.Fatal("a cancelled call is neither retryable nor terminal")
	}
	msg := (&Error{Op: "produce", Topic: "t", Node: "http://n", Status: 503, Code: "unavailable", Message: "later", kind: ErrUnavailable, uncertain: true}).Error()
	if msg != "narad: produce t at http://n: 503 unavailable: later (outcome unknown)" {
		t.Fatal(msg)
	}
}

func TestFullJitterStaysUnderItsCap(t *testing.T) {
	f := NewFullJitter(50*time.Millisecond, 400*time.Millisecond)
	caps := []time.Duration{50, 100, 200, 400, 400, 400}
	for i, c := range caps {
		if d := f.NextBackOff(); d < 0 || d > c*time.Millisecond {
			t.Fatalf("wait %d = %s over cap %s", i, d, c*time.Millisecond)
		}
	}
	f.Reset()
	if d := f.NextBackOff(); d > 50*time.Millisecond {
		t.Fatalf("after reset %s", d)
	}
}

func TestExtendParam(t *testing.T) {
	cases := map[string]string{
		extendParam(0, true):                     "0",
		extendParam(0, false):                    "true",
		extendParam(1500*time.Millisecond, true): "1500",
		extendParam(time.Microsecond, false):     "1",
		extendParam(48*time.Hour, false):         "43200000",
	}
	for got, want := range cases {
		if got != want {
			t.Errorf("got %s want %s", got, want)
		}
	}
}

func TestNewRejectsBadEndpoints(t *testing.T) {
	if _, err := New(nil); err == nil {
		t.Fatal("no endpoints")
	}
	if _, err := New([]string{"http://"}); err == nil {
		t.Fatal("empty host")
	}
	c, err := New([]string{"127.0.0.1:1", "https://n.example:7942/"})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Endpoints(); got[0] != "http://127.0.0.1:1" || got[1] != "https://n.example:7942" {
		t.Fatal(got)
	}
	c.Close()
	c.Close()
	if _, err := c.Topics(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}
