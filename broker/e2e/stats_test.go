package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

type statsSample struct {
	AtMs               int64   `json:"at_ms"`
	Produced           int64   `json:"produced"`
	Acked              int64   `json:"acked"`
	ProduceRate        float64 `json:"produce_rate"`
	AckRate            float64 `json:"ack_rate"`
	Backlog            int64   `json:"backlog"`
	InFlight           int64   `json:"in_flight"`
	OldestUnackedAgeMs int64   `json:"oldest_unacked_age_ms"`
}

type topicStats struct {
	Topic      string        `json:"topic"`
	Node       string        `json:"node"`
	IntervalMs int64         `json:"interval_ms"`
	Samples    []statsSample `json:"samples"`
}

type topicStatsList struct {
	Node       string       `json:"node"`
	IntervalMs int64        `json:"interval_ms"`
	Topics     []topicStats `json:"topics"`
}

func (a *api) stats(topic string) topicStats {
	a.t.Helper()
	var st topicStats
	if r := a.Get(topicPath(topic) + "/stats"); r.Expect(a.t, http.StatusOK) {
		r.JSON(a.t, &st)
	}
	return st
}

// sums adds up produced and acked over the samples and returns the last sample.
func (st topicStats) sums() (produced, acked int64, last statsSample) {
	for _, s := range st.Samples {
		produced += s.Produced
		acked += s.Acked
	}
	if len(st.Samples) > 0 {
		last = st.Samples[len(st.Samples)-1]
	}
	return produced, acked, last
}

// TestStatsRoute: the stats route shows produce and ack rates and the backlog move as
// messages are produced and acked, /v1/stats lists only the topics a user may see, a
// user without a grant gets the 404 of a missing topic, and a deleted topic's samples
// are gone.
func TestStatsRoute(t *testing.T) {
	t.Parallel()
	n := testutil.StartNarad(t, testutil.Options{Args: []string{"--stats-interval", "1s"}, Env: []string{"NARAD_ADMIN_PASSWORD=stats-admin-1"}})
	a := &api{Client: n.Client().WithBasicAuth("admin", "stats-admin-1"), t: t}
	a.createTopic("st.orders", map[string]any{"partitions": 2})
	a.createTopic("other", map[string]any{"partitions": 1})

	st := a.stats("st.orders")
	if st.Topic != "st.orders" || st.IntervalMs != 1000 || st.Node == "" {
		t.Fatalf("stats of a new topic: %+v", st)
	}
	for i := 0; i < 6; i++ {
		a.produceJSON("st.orders", map[string]any{"i": i}, "")
	}
	waitFor(t, 30*time.Second, "the samples to show 6 produced and a backlog of 6", func() bool {
		p, _, last := a.stats("st.orders").sums()
		return p == 6 && last.Backlog == 6
	})
	_, _, last := a.stats("st.orders").sums()
	if last.OldestUnackedAgeMs <= 0 {
		t.Errorf("oldest unacked age %d ms with 6 messages unsettled, want > 0", last.OldestUnackedAgeMs)
	}
	sawRate := false
	for _, s := range a.stats("st.orders").Samples {
		if s.Produced > 0 && s.ProduceRate <= 0 {
			t.Errorf("sample %+v: produced without a produce rate", s)
		}
		sawRate = sawRate || s.ProduceRate > 0
	}
	if !sawRate {
		t.Error("no sample with a produce rate")
	}

	for i := 0; i < 4; i++ {
		a.mustAck("st.orders", a.mustConsume("st.orders", "5s"))
	}
	waitFor(t, 30*time.Second, "the samples to show 4 acked and a backlog of 2", func() bool {
		_, acked, last := a.stats("st.orders").sums()
		return acked == 4 && last.Backlog == 2 && last.InFlight == 0
	})

	// A user with a grant on st.* sees that topic only.
	a.PostJSON("/v1/users", map[string]any{"username": "viewer", "password": "viewer-pass-1",
		"grants": []map[string]any{{"action": "consume", "topics": []string{"st.*"}}}}).Expect(t, http.StatusCreated)
	v := &api{Client: n.Client().WithBasicAuth("viewer", "viewer-pass-1"), t: t}
	var list topicStatsList
	if r := v.Get("/v1/stats"); r.Expect(t, http.StatusOK) && r.JSON(t, &list) {
		if len(list.Topics) != 1 || list.Topics[0].Topic != "st.orders" || list.IntervalMs != 1000 {
			t.Errorf("viewer's /v1/stats: %+v, want st.orders only", list)
		}
	}
	v.Get(topicPath("other")+"/stats").ExpectError(t, http.StatusNotFound, "topic_not_found")
	// A user who may see no topic still learns the node's interval.
	a.PostJSON("/v1/users", map[string]any{"username": "nobody", "password": "nobody-pass-1"}).Expect(t, http.StatusCreated)
	nobody := &api{Client: n.Client().WithBasicAuth("nobody", "nobody-pass-1"), t: t}
	if r := nobody.Get("/v1/stats"); r.Expect(t, http.StatusOK) && r.JSON(t, &list) {
		if len(list.Topics) != 0 || list.IntervalMs != 1000 || list.Node != st.Node {
			t.Errorf("/v1/stats of a user without grants: %+v, want no topics, the node's 1000 ms and node %s", list, st.Node)
		}
	}
	v.stats("st.orders")
	if r := a.Get("/v1/stats"); r.Expect(t, http.StatusOK) && r.JSON(t, &list) {
		if len(list.Topics) != 2 || list.Topics[0].Topic != "other" || list.Topics[1].Topic != "st.orders" {
			t.Errorf("admin's /v1/stats: %+v, want other and st.orders", list)
		}
	}
	n.Client().Get("/v1/stats").ExpectError(t, http.StatusUnauthorized, "unauthenticated")

	a.Do(http.MethodDelete, topicPath("st.orders"), nil).Expect(t, http.StatusNoContent)
	a.Get(topicPath("st.orders")+"/stats").ExpectError(t, http.StatusNotFound, "topic_not_found")
	a.createTopic("st.orders", map[string]any{"partitions": 1})
	if p, acked, _ := a.stats("st.orders").sums(); p != 0 || acked != 0 {
		t.Errorf("the topic created again carries the old one's samples: %d produced, %d acked", p, acked)
	}
}

type syncRounds struct {
	AtMs            int64   `json:"at_ms"`
	IntervalMs      int64   `json:"interval_ms"`
	Rounds          int64   `json:"rounds"`
	Files           int64   `json:"files"`
	RoundsPerSecond float64 `json:"rounds_per_second"`
	MeanMs          float64 `json:"mean_ms"`
	MaxMs           float64 `json:"max_ms"`
}

type nodeHealth struct {
	ID            string      `json:"id"`
	Ready         bool        `json:"ready"`
	DiskFreeBytes *int64      `json:"disk_free_bytes"`
	DiskSizeBytes *int64      `json:"disk_size_bytes"`
	SyncMode      string      `json:"sync_mode"`
	Sync          *syncRounds `json:"sync"`
}

// TestStatsNodeHealth: /v1/stats gives an admin the node's health: ready, its data
// volume's size and free space, and once messages are produced an interval with shared
// sync rounds whose figures fit together. A user who is not an admin gets no
// node_health, as /metrics is refused them.
func TestStatsNodeHealth(t *testing.T) {
	t.Parallel()
	n := testutil.StartNarad(t, testutil.Options{Args: []string{"--stats-interval", "500ms"}, Env: []string{"NARAD_ADMIN_PASSWORD=health-admin-1"}})
	a := &api{Client: n.Client().WithBasicAuth("admin", "health-admin-1"), t: t}
	health := func(c *api) *nodeHealth {
		t.Helper()
		var list struct {
			Node       string      `json:"node"`
			NodeHealth *nodeHealth `json:"node_health"`
		}
		if r := c.Get("/v1/stats"); r.Expect(t, http.StatusOK) {
			r.JSON(t, &list)
		}
		if list.NodeHealth != nil && list.NodeHealth.ID != list.Node {
			t.Errorf("node_health of %q in the answer of node %q", list.NodeHealth.ID, list.Node)
		}
		return list.NodeHealth
	}
	h := health(a)
	if h == nil {
		t.Fatal("no node_health for the admin")
	}
	if h.ID == "" || !h.Ready || h.SyncMode != "wal" {
		t.Errorf("node_health %+v, want an id, ready and wal sync (the default)", h)
	}
	if h.DiskSizeBytes == nil || h.DiskFreeBytes == nil || *h.DiskSizeBytes <= 0 || *h.DiskFreeBytes < 0 || *h.DiskFreeBytes > *h.DiskSizeBytes {
		t.Errorf("disk free %v of %v bytes, want a size > 0 and free within it", h.DiskFreeBytes, h.DiskSizeBytes)
	}

	a.createTopic("health", map[string]any{"partitions": 1})
	// Each produce is synced before it is answered; producing while polling keeps the
	// last interval from being a quiet one however slowly the polls come.
	i := 0
	waitFor(t, 30*time.Second, "an interval with sync rounds", func() bool {
		a.produceJSON("health", map[string]any{"i": i}, "")
		i++
		h = health(a)
		return h != nil && h.Sync != nil && h.Sync.Rounds > 0
	})
	s := h.Sync
	if s.IntervalMs <= 0 || s.AtMs <= 0 || s.Files < s.Rounds || s.RoundsPerSecond <= 0 {
		t.Errorf("sync rounds %+v, want an interval, at least a file per round and a rate", s)
	}
	if s.MaxMs <= 0 || s.MeanMs <= 0 || s.MeanMs > s.MaxMs || s.MaxMs > 60_000 {
		t.Errorf("sync rounds %+v, want 0 < mean <= max < a minute", s)
	}

	a.PostJSON("/v1/users", map[string]any{"username": "watcher", "password": "watcher-pass-1",
		"grants": []map[string]any{{"action": "consume", "topics": []string{"*"}}}}).Expect(t, http.StatusCreated)
	if h := health(&api{Client: n.Client().WithBasicAuth("watcher", "watcher-pass-1"), t: t}); h != nil {
		t.Errorf("a user who is not an admin got node_health %+v", h)
	}
}
