package narad_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// steps is a Backoff written without any backoff library: the SDK's API must not make
// callers import one (it used to take a github.com/cenkalti/backoff BackOff).
type steps struct {
	calls *atomic.Int32
	stop  int32 // NextBackOff answers StopBackoff from this call on (0: never)
}

func (s *steps) NextBackOff() time.Duration {
	n := s.calls.Add(1)
	if s.stop > 0 && n >= s.stop {
		return narad.StopBackoff
	}
	return time.Millisecond
}

func (s *steps) Reset() {}

// TestRetryPolicyTakesTheSDKsOwnBackoff: a RetryPolicy's Backoff is the SDK's interface;
// its waits pace the retries and StopBackoff ends them before Attempts are used up.
func TestRetryPolicyTakesTheSDKsOwnBackoff(t *testing.T) {
	for _, tc := range []struct {
		name            string
		stop            int32
		wantWaits       int32
		wantSentAtLeast int32
	}{
		{"paces every retry", 0, 3, 4},
		{"StopBackoff ends the call", 2, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var waits, sent atomic.Int32
			c, ft := newFaultClient(t, narad.WithRetry(narad.RetryPolicy{Attempts: 4, Backoff: func() narad.Backoff {
				return &steps{calls: &waits, stop: tc.stop}
			}}))
			ft.set(func(r *http.Request) (*http.Response, error) {
				if r.URL.Path == "/v1/topics" {
					sent.Add(1)
					return unavailable(""), nil
				}
				return nil, nil
			}, nil)
			_, err := c.Topics(ctxT(t))
			if !errors.Is(err, narad.ErrUnavailable) {
				t.Fatalf("want ErrUnavailable, got %v", err)
			}
			if waits.Load() != tc.wantWaits || sent.Load() != tc.wantSentAtLeast {
				t.Fatalf("%d waits asked for, %d requests sent; want %d and %d", waits.Load(), sent.Load(), tc.wantWaits, tc.wantSentAtLeast)
			}
		})
	}
}
