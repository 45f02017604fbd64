package narad_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

func TestReplayBoundedInLogOrderAndResumable(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 2})
	var out []narad.Outgoing
	for i := 0; i < 25; i++ {
		out = append(out, narad.Outgoing{Body: fmt.Sprintf("%d", i), Partition: narad.Pin(int32(i % 2))})
	}
	if _, err := c.ProduceBatch(ctx, topic, out); err != nil {
		t.Fatal(err)
	}
	// Read the first 10, remembering the position.
	var pos narad.Position
	var got []string
	for m, err := range c.Replay(ctx, topic, narad.FromStart(), narad.WithReplayBatch(4)) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(m.Bytes()))
		pos.Advance(m)
		if len(got) == 10 {
			break
		}
	}
	// The position survives a round trip through JSON, as a stored checkpoint would.
	b, _ := json.Marshal(pos)
	var resumed narad.Position
	if err := json.Unmarshal(b, &resumed); err != nil {
		t.Fatal(err)
	}
	for m, err := range c.Replay(ctx, topic, resumed, narad.WithReplayBatch(4)) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(m.Bytes()))
	}
	if len(got) != 25 {
		t.Fatalf("replayed %d messages, want 25: %v", len(got), got)
	}
	seen := map[string]bool{}
	last := map[int]int{0: -2, 1: -1}
	for _, s := range got {
		var n int
		fmt.Sscan(s, &n)
		if seen[s] || n <= last[n%2] {
			t.Fatalf("out of order or twice: %v", got)
		}
		seen[s], last[n%2] = true, n
	}
	// One partition, from an offset.
	var p1 []string
	for m, err := range c.Replay(ctx, topic, narad.FromOffsets(map[int32]int64{1: 10}), narad.OnlyPartitions(1)) {
		if err != nil {
			t.Fatal(err)
		}
		p1 = append(p1, string(m.Bytes()))
	}
	if len(p1) != 2 || p1[0] != "21" || p1[1] != "23" {
		t.Fatalf("partition 1 from 10: %v", p1)
	}
}

func TestReplayFromTime(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	if _, err := c.Produce(ctx, topic, "old"); err != nil {
		t.Fatal(err)
	}
	var mark time.Time
	for m, err := range c.Replay(ctx, topic, narad.FromStart()) {
		if err != nil {
			t.Fatal(err)
		}
		mark = m.Timestamp.Add(time.Millisecond)
	}
	// Make sure the next message is stamped after the mark.
	eventually(t, 5*time.Second, "the clock to pass the mark", func() bool { return time.Now().After(mark.Add(time.Millisecond)) })
	if _, err := c.Produce(ctx, topic, "new"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for m, err := range c.Replay(ctx, topic, narad.FromTime(mark)) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(m.Bytes()))
	}
	if len(got) != 1 || got[0] != "new" {
		t.Fatalf("from time: %v", got)
	}
}

func TestReplayFollowSeesNewMessages(t *testing.T) {
	c := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Produce(ctx, topic, "before"); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range c.Replay(ctx, topic, narad.FromStart(), narad.Follow(), narad.WithFollowInterval(50*time.Millisecond)) {
			if err != nil {
				t.Error(err)
				return
			}
			got <- string(m.Bytes())
			if string(m.Bytes()) == "after" {
				return
			}
		}
	}()
	if s := <-got; s != "before" {
		t.Fatalf("first %q", s)
	}
	if _, err := c.Produce(ctx, topic, "after"); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "after" {
			t.Fatalf("second %q", s)
		}
	case <-ctx.Done():
		t.Fatal("the following replay never saw the new message")
	}
	<-done
	// A following replay ends when its context does.
	ctx2, cancel2 := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() {
		for range c.Replay(ctx2, topic, narad.FromOffsets(map[int32]int64{0: 100, 1: 100}), narad.Follow()) {
		}
		close(ended)
	}()
	cancel2()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the following replay did not end with its context")
	}
}

func TestReplayMissingTopicYieldsTerminalError(t *testing.T) {
	c := newClient(t)
	n := 0
	for m, err := range c.Replay(ctxT(t), "no-such-topic-r", narad.FromStart()) {
		n++
		if m != nil || err == nil {
			t.Fatalf("got %v %v", m, err)
		}
	}
	if n != 1 {
		t.Fatalf("%d items, want one error", n)
	}
}

// rewriteJSON replaces resp's JSON body with what edit makes of it.
func rewriteJSON(t *testing.T, resp *http.Response, edit func(map[string]any)) *http.Response {
	t.Helper()
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Error(err)
		return resp
	}
	var body map[string]any
	if err := json.Unmarshal(data, &body); err != nil {
		t.Errorf("%s: %v", data, err)
		return resp
	}
	edit(body)
	data, _ = json.Marshal(body)
	resp.Body = io.NopCloser(bytes.NewReader(data))
	resp.ContentLength = int64(len(data))
	resp.Header.Del("Content-Length")
	return resp
}

// partitionDown marks partition p of a topic answer unavailable, as a broker does when
// the node holding it cannot be reached: its counters are given as 0.
func partitionDown(body map[string]any, p int) {
	for _, s := range body["partition_stats"].([]any) {
		s := s.(map[string]any)
		if int(s["partition"].(float64)) == p {
			s["available"] = false
			for _, k := range []string{"oldest_offset", "next_offset", "high_watermark", "ack_frontier", "acked_ahead", "in_flight", "backlog"} {
				s[k] = 0
			}
		}
	}
}

func quickRetry(attempts int) narad.Option {
	return narad.WithRetry(narad.RetryPolicy{Attempts: attempts, Backoff: func() narad.Backoff {
		return narad.NewFullJitter(5*time.Millisecond, 20*time.Millisecond)
	}})
}

// produceTo writes n messages "p:i" to partition p.
func produceTo(t *testing.T, c *narad.Client, topic string, p int32, from, n int) {
	t.Helper()
	var out []narad.Outgoing
	for i := from; i < from+n; i++ {
		out = append(out, narad.Outgoing{Body: fmt.Sprintf("%d:%d", p, i), Partition: narad.Pin(p)})
	}
	if _, err := c.ProduceBatch(ctxT(t), topic, out); err != nil {
		t.Fatal(err)
	}
}

// A bounded replay must not take the zero offsets of an unavailable partition for its
// end: it reads the topic again until the partition is available, then replays it whole.
func TestReplayWaitsForAnUnavailablePartitionsEnd(t *testing.T) {
	c, ft := newFaultClient(t, quickRetry(6))
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 2})
	produceTo(t, c, topic, 0, 0, 3)
	produceTo(t, c, topic, 1, 0, 4)
	reads := partition1DownForTwoReads(t, ft, topic)
	got := map[int32]int{}
	for m, err := range c.Replay(ctxT(t), topic, narad.FromStart()) {
		if err != nil {
			t.Fatal(err)
		}
		got[m.Partition]++
	}
	if got[0] != 3 || got[1] != 4 {
		t.Fatalf("replayed %v, want 3 messages of partition 0 and 4 of partition 1", got)
	}
	if n := reads.Load(); n < 3 {
		t.Fatalf("the topic was read %d times, want 3 (twice unavailable, then available)", n)
	}
}

// A partition that stays unavailable fails the bounded replay with ErrUnavailable naming
// it; the replay never ends as if it had read it.
func TestReplayFailsWhenAPartitionStaysUnavailable(t *testing.T) {
	c, ft := newFaultClient(t, quickRetry(3))
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 2})
	produceTo(t, c, topic, 1, 0, 2)
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if err == nil && r.Method == http.MethodGet && r.URL.Path == "/v1/topics/"+topic && resp.StatusCode == 200 {
			return rewriteJSON(t, resp, func(b map[string]any) { partitionDown(b, 1) }), nil
		}
		return resp, err
	})
	var failure error
	for m, err := range c.Replay(ctxT(t), topic, narad.FromStart()) {
		if err != nil {
			failure = err
			break
		}
		t.Fatalf("replayed %v while its partition's end is unknown", m)
	}
	if !errors.Is(failure, narad.ErrUnavailable) || !narad.Retryable(failure) || !strings.Contains(failure.Error(), "partition 1 ") {
		t.Fatalf("got %v, want a retryable unavailable error naming partition 1", failure)
	}
}

// When the end cuts a page, the position stops after the last message the replay
// returned: a replay resumed from it reads what was written after the first began.
func TestReplayPositionStopsAtTheLastMessageReturned(t *testing.T) {
	c := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	produceTo(t, c, topic, 0, 0, 5)
	var pos narad.Position
	var got []int64
	for m, err := range c.Replay(ctxT(t), topic, narad.FromStart(), narad.WithReplayBatch(4)) {
		if err != nil {
			t.Fatal(err)
		}
		if m.Offset == 0 {
			// Written after the replay began: the second page holds 4..7, cut after 4.
			produceTo(t, c, topic, 0, 5, 5)
		}
		got = append(got, m.Offset)
		pos.Advance(m)
	}
	if len(got) != 5 || pos.Offsets[0] != 5 {
		t.Fatalf("first replay gave %v and position %v, want offsets 0..4 and position 5", got, pos.Offsets)
	}
	for m, err := range c.Replay(ctxT(t), topic, pos) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Offset)
	}
	for i, o := range got {
		if o != int64(i) {
			t.Fatalf("offsets %v, want 0..9 once each", got)
		}
	}
	if len(got) != 10 {
		t.Fatalf("offsets %v, want 0..9", got)
	}
}

// A position past the end follows the read's lower next_offset, so messages written
// there later are replayed, not skipped up to the position's offset.
func TestReplayFollowsALowerNextOffset(t *testing.T) {
	c, ft := newFaultClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	produceTo(t, c, topic, 0, 0, 13)
	readPast := make(chan struct{})
	var once sync.Once
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if err == nil && strings.HasSuffix(r.URL.Path, "/messages") && r.URL.Query().Get("from") == "20" {
			once.Do(func() { close(readPast) })
		}
		return resp, err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan int64, 20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range c.Replay(ctx, topic, narad.FromOffsets(map[int32]int64{0: 20}), narad.Follow(), narad.WithFollowInterval(20*time.Millisecond)) {
			if err != nil {
				t.Error(err)
				return
			}
			got <- m.Offset
			if m.Offset == 22 {
				return
			}
		}
	}()
	select {
	case <-readPast:
	case <-ctx.Done():
		t.Fatal("the replay never read from offset 20")
	}
	produceTo(t, c, topic, 0, 13, 10) // offsets 13..22
	for want := int64(13); want <= 22; want++ {
		select {
		case o := <-got:
			if o != want {
				t.Fatalf("replayed offset %d, want %d", o, want)
			}
		case <-ctx.Done():
			t.Fatalf("offset %d never came", want)
		}
	}
	<-done
}

// A position keeps the topic's incarnation: once the topic is deleted and created
// again, a replay from it fails with a conflict instead of reading the new topic.
func TestReplayRefusesAnotherIncarnationOfTheTopic(t *testing.T) {
	c, ctx, topic, info := replayedTopic(t, 1)
	var pos narad.Position
	for m, err := range c.Replay(ctx, topic, narad.FromStart()) {
		if err != nil {
			t.Fatal(err)
		}
		pos.Advance(m)
	}
	saved, _ := json.Marshal(pos)
	var fields map[string]any
	json.Unmarshal(saved, &fields)
	if fields["incarnation"] != info.Incarnation {
		t.Fatalf("saved position %s, want incarnation %q", saved, info.Incarnation)
	}
	if err := c.DeleteTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTopic(ctx, topic, narad.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	produceTo(t, c, topic, 0, 0, 3)
	var resumed narad.Position
	if err := json.Unmarshal(saved, &resumed); err != nil {
		t.Fatal(err)
	}
	n := 0
	for m, err := range c.Replay(ctx, topic, resumed) {
		n++
		if m != nil {
			t.Fatalf("replayed %q of the new topic", m.Bytes())
		}
		wantIncarnationMismatch(t, err)
	}
	if n != 1 {
		t.Fatalf("%d items, want one error", n)
	}
}

func wantIncarnationMismatch(t *testing.T, err error) {
	t.Helper()
	var e *narad.Error
	if !errors.Is(err, narad.ErrConflict) || !errors.As(err, &e) || e.Code != "incarnation_mismatch" || narad.Retryable(err) ||
		!strings.Contains(e.Message, "deleted and created again") || !strings.Contains(e.Message, "new position") {
		t.Fatalf("got %v, want a conflict with code incarnation_mismatch saying to start from a new position", err)
	}
}

// Every read names the incarnation the replay began with: a topic deleted and created
// again while the replay runs answers 409, and the replay ends with the conflict.
func TestReplayReadsNameTheIncarnation(t *testing.T) {
	c, ft := newFaultClient(t)
	admin := newClient(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	produceTo(t, c, topic, 0, 0, 2)
	var once sync.Once
	ft.set(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/messages") {
			once.Do(func() {
				ctx := ctxT(t)
				if err := admin.DeleteTopic(ctx, topic); err != nil {
					t.Error(err)
				}
				if _, err := admin.CreateTopic(ctx, topic, narad.TopicConfig{Partitions: 1}); err != nil {
					t.Error(err)
				}
				produceTo(t, admin, topic, 0, 0, 2)
			})
		}
		return nil, nil
	}, nil)
	n := 0
	for m, err := range c.Replay(ctxT(t), topic, narad.FromStart()) {
		n++
		if m != nil {
			t.Fatalf("replayed %q of the new topic", m.Bytes())
		}
		wantIncarnationMismatch(t, err)
	}
	if n != 1 {
		t.Fatalf("%d items, want one error", n)
	}
}

// A position saved without an incarnation (by an older SDK) still loads, and takes the
// topic's current incarnation as it advances.
func TestReplayPositionWithoutIncarnationAdoptsTheCurrentOne(t *testing.T) {
	c, ctx, topic, info := replayedTopic(t, 3)
	var pos narad.Position
	if err := json.Unmarshal([]byte(`{"offsets":{"0":1}}`), &pos); err != nil {
		t.Fatal(err)
	}
	var got []int64
	for m, err := range c.Replay(ctx, topic, pos) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Offset)
		pos.Advance(m)
	}
	saved, _ := json.Marshal(pos)
	var fields map[string]any
	json.Unmarshal(saved, &fields)
	if len(got) != 2 || fields["incarnation"] != info.Incarnation {
		t.Fatalf("replayed %v, position %s; want offsets 1 and 2, incarnation %q", got, saved, info.Incarnation)
	}
}

// damagedAt makes a read answer look as if the message at offset o were damaged: the
// broker leaves it out and names its offset.
func damagedAt(o int64) func(map[string]any) {
	return func(b map[string]any) {
		var kept []any
		for _, m := range b["messages"].([]any) {
			if int64(m.(map[string]any)["offset"].(float64)) != o {
				kept = append(kept, m)
			}
		}
		b["messages"] = kept
		b["damaged"] = []int64{o}
	}
}

// A damaged message the broker read past is logged as a warning and the replay goes on.
func TestReplayWarnsOfDamagedMessagesAndGoesOn(t *testing.T) {
	logs := &recordingHandler{}
	c, ft := newFaultClient(t, narad.WithLogger(slog.New(logs)))
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	produceTo(t, c, topic, 0, 0, 3)
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if err == nil && strings.HasSuffix(r.URL.Path, "/messages") && resp.StatusCode == 200 {
			return rewriteJSON(t, resp, damagedAt(1)), nil
		}
		return resp, err
	})
	var got []int64
	for m, err := range c.Replay(ctxT(t), topic, narad.FromStart()) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Offset)
	}
	if len(got) != 2 || got[0] != 0 || got[1] != 2 {
		t.Fatalf("replayed %v, want 0 and 2", got)
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for _, r := range logs.recs {
		if r.Level != slog.LevelWarn || !strings.Contains(r.Message, "damaged") {
			continue
		}
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
		if attrs["topic"] == topic && attrs["partition"] == "0" && attrs["offset"] == "1" {
			return
		}
	}
	t.Fatal("no warning named the damaged message")
}

// A 503 on a read is retried with the client's backoff; the replay misses nothing.
func TestReplayRetriesUnavailableReads(t *testing.T) {
	c, ft := newFaultClient(t, quickRetry(4))
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	produceTo(t, c, topic, 0, 0, 3)
	var refused atomic.Int32
	ft.set(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/messages") && refused.Add(1) <= 2 {
			return unavailable(""), nil
		}
		return nil, nil
	}, nil)
	var got []int64
	for m, err := range c.Replay(ctxT(t), topic, narad.FromStart()) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Offset)
	}
	if len(got) != 3 || refused.Load() < 3 {
		t.Fatalf("replayed %v after %d reads, want 3 messages after two refused reads", got, refused.Load())
	}
}

// replayedTopic makes a topic of one partition holding n messages and returns it with
// its client, a context for the test and the topic's info.
func replayedTopic(t *testing.T, n int) (*narad.Client, context.Context, string, *narad.TopicInfo) {
	t.Helper()
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 1})
	info, err := c.Topic(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	produceTo(t, c, topic, 0, 0, n)
	return c, ctx, topic, info
}

// partition1DownForTwoReads makes the first two reads of topic answer its partition 1
// unavailable (the zero figures of a partition whose node is out of reach); it counts
// the topic's reads.
func partition1DownForTwoReads(t *testing.T, ft *faultTransport, topic string) *atomic.Int32 {
	var reads atomic.Int32
	ft.set(nil, func(r *http.Request, resp *http.Response, err error) (*http.Response, error) {
		if err == nil && r.Method == http.MethodGet && r.URL.Path == "/v1/topics/"+topic && resp.StatusCode == 200 {
			if reads.Add(1) <= 2 {
				return rewriteJSON(t, resp, func(b map[string]any) { partitionDown(b, 1) }), nil
			}
		}
		return resp, err
	})
	return &reads
}
