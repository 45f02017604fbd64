package narad_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	narad "github.com/narad-mq/narad/sdk-go"
)

// A damaged message the broker read past is reported to the observer, naming it.
func TestReplayReportsDamagedMessagesToTheObserver(t *testing.T) {
	var mu sync.Mutex
	var events []narad.Event
	c, ft := newFaultClient(t, narad.WithObserver(func(e narad.Event) {
		if e.Kind == narad.EventReplayDamaged {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}
	}))
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 2})
	produceTo(t, c, topic, 1, 0, 4)
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if err == nil && strings.HasSuffix(r.URL.Path, "/partitions/1/messages") && resp.StatusCode == 200 {
			return rewriteJSON(t, resp, damagedAt(2)), nil
		}
		return resp, err
	})
	n := 0
	for _, err := range c.Replay(ctxT(t), topic, narad.FromStart()) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	mu.Lock()
	defer mu.Unlock()
	if n != 3 || len(events) != 1 {
		t.Fatalf("replayed %d messages and reported %v, want 3 and one damaged message", n, events)
	}
	if e := events[0]; e.Topic != topic || e.Partition != 1 || e.Offset != 2 || e.Kind.String() != "replay_damaged" {
		t.Fatalf("reported %+v, want %s partition 1 offset 2", e, topic)
	}
}
