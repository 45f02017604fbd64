package narad_test

import (
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/sdk-go"
)

// Every kind of position saves as the one JSON form all the SDKs write
// (docs/sdk/contract.md, Replay), byte for byte.
func TestPositionWritesTheOneForm(t *testing.T) {
	ms := int64(1733500000000)
	for _, tc := range []struct {
		name string
		pos  narad.Position
		want string
	}{
		{"start", narad.FromStart(), `{"offsets":{}}`},
		{"time", narad.FromTime(time.UnixMilli(ms).Add(999 * time.Microsecond)), `{"offsets":{},"time_ms":1733500000000}`},
		{"end", narad.FromEnd(), `{"offsets":{},"start":"latest"}`},
		{"offsets", narad.FromOffsets(map[int32]int64{10: 1, 3: 7, 0: 12}), `{"offsets":{"0":12,"3":7,"10":1}}`},
		{"everything", narad.Position{Offsets: map[int32]int64{0: 12}, Time: time.UnixMilli(ms), Incarnation: "42"},
			`{"offsets":{"0":12},"time_ms":1733500000000,"incarnation":"42"}`},
		{"end with incarnation", narad.Position{Offsets: map[int32]int64{1: 2}, AtEnd: true, Incarnation: "7"},
			`{"offsets":{"1":2},"start":"latest","incarnation":"7"}`},
	} {
		got, err := json.Marshal(tc.pos)
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: wrote %s (%v), want %s", tc.name, got, err, tc.want)
		}
	}
	if b, err := json.Marshal(narad.Position{Time: time.Now(), AtEnd: true}); err == nil || !strings.Contains(err.Error(), "both Time and AtEnd") {
		t.Errorf("a position at a time and at the end wrote %s (%v), want an error", b, err)
	}
}

// The one form loads, and so do the forms Go, Python and TypeScript wrote before it.
func TestPositionReadsTheOneFormAndTheOldOnes(t *testing.T) {
	at := time.UnixMilli(1733500000000)
	for _, tc := range []struct {
		name, in string
		want     narad.Position
	}{
		{"one form", `{"offsets":{"0":12,"3":7},"time_ms":1733500000000,"incarnation":"42"}`,
			narad.Position{Offsets: map[int32]int64{0: 12, 3: 7}, Time: at, Incarnation: "42"}},
		{"one form, latest", `{"offsets":{"0":12},"start":"latest"}`, narad.Position{Offsets: map[int32]int64{0: 12}, AtEnd: true}},
		{"one form, no offsets", `{"incarnation":"42"}`, narad.Position{Incarnation: "42"}},
		{"one form, nulls", `{"offsets":null,"time_ms":null,"start":null,"incarnation":null}`, narad.Position{}},
		{"old Go", `{"offsets":{"0":12},"time":"2024-12-06T15:46:40.000123456Z","incarnation":"42"}`,
			narad.Position{Offsets: map[int32]int64{0: 12}, Time: at.Add(123456), Incarnation: "42"}},
		{"old Go, offset time", `{"time":"2024-12-06T16:46:40+01:00"}`, narad.Position{Time: at}},
		{"old Python", `{"incarnation":"42","offsets":{"0":12},"time_ms":1733500000000}`,
			narad.Position{Offsets: map[int32]int64{0: 12}, Time: at, Incarnation: "42"}},
		{"old TypeScript, earliest", `{"offsets":{"0":12},"otherwise":"earliest","incarnation":"42"}`,
			narad.Position{Offsets: map[int32]int64{0: 12}, Incarnation: "42"}},
		{"old TypeScript, latest", `{"offsets":{},"otherwise":"latest"}`, narad.Position{AtEnd: true}},
		{"old TypeScript, time", `{"offsets":{"1":3},"otherwise":{"time":1733500000000}}`,
			narad.Position{Offsets: map[int32]int64{1: 3}, Time: at}},
	} {
		var got narad.Position
		if err := json.Unmarshal([]byte(tc.in), &got); err != nil {
			t.Errorf("%s: %s: %v", tc.name, tc.in, err)
			continue
		}
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(tc.want)
		if string(g) != string(w) || !got.Time.Equal(tc.want.Time) {
			t.Errorf("%s: %s read as %s (time %v), want %s", tc.name, tc.in, g, got.Time, w)
		}
	}
}

// Malformed positions are refused with an error saying what is wrong, never read as
// something else.
func TestPositionRefusesMalformedJSON(t *testing.T) {
	for in, want := range map[string]string{
		`[]`:                                 "JSON object",
		`"x"`:                                "JSON object",
		`{"offsets":[1]}`:                    "offsets must be an object",
		`{"offsets":{"0":1.5}}`:              "integer from 0",
		`{"offsets":{"0":"12"}}`:             "integer from 0",
		`{"offsets":{"0":-1}}`:               "integer from 0",
		`{"offsets":{"0":true}}`:             "integer from 0",
		`{"offsets":{"x":1}}`:                "partition",
		`{"offsets":{"-1":1}}`:               "partition",
		`{"offsets":{"01":1}}`:               "partition",
		`{"offsets":{"4294967296":1}}`:       "partition",
		`{"time_ms":1.5}`:                    "time_ms",
		`{"time_ms":"1733500000000"}`:        "time_ms",
		`{"start":"earliest"}`:               "start",
		`{"start":"newest"}`:                 "start",
		`{"start":1}`:                        "start",
		`{"time_ms":1,"start":"latest"}`:     "both",
		`{"time_ms":1,"otherwise":"latest"}`: "both",
		`{"time":"yesterday"}`:               "RFC 3339",
		`{"otherwise":"soon"}`:               "otherwise",
		`{"otherwise":{"time":"x"}}`:         "otherwise.time",
		`{"incarnation":42}`:                 "incarnation",
	} {
		var p narad.Position
		err := json.Unmarshal([]byte(in), &p)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: read as %+v (%v), want an error about %q", in, p, err, want)
		}
	}
}

// A replay from FromEnd reads only what is written after it starts; the position the
// first message advances names every partition at the offset the replay started at,
// so that resuming from it misses nothing written to the partitions it has not read.
func TestReplayFromEnd(t *testing.T) {
	c := newClient(t)
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 2})
	produceTo(t, c, topic, 0, 0, 3)
	produceTo(t, c, topic, 1, 0, 2)
	for m, err := range c.Replay(ctx, topic, narad.FromEnd()) {
		t.Fatalf("a bounded replay from the end yielded %v, %v", m, err)
	}
	var got []string
	for m, err := range c.Replay(ctx, topic, narad.Position{Offsets: map[int32]int64{0: 1}, AtEnd: true}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(m.Bytes()))
	}
	if strings.Join(got, " ") != "0:1 0:2" {
		t.Fatalf("a replay from offset 1 of partition 0 and the end of the others read %v", got)
	}

	var reading atomic.Bool
	f := newClient(t, narad.WithObserver(func(e narad.Event) {
		if e.Kind == narad.EventRequest && e.Op == "read-messages" {
			reading.Store(true)
		}
	}))
	type first struct {
		m   *narad.Message
		pos narad.Position
		err error
	}
	out := make(chan first, 1)
	go func() {
		pos := narad.FromEnd()
		for m, err := range f.Replay(ctx, topic, pos, narad.Follow(), narad.WithFollowInterval(20*time.Millisecond)) {
			if err == nil {
				pos.Advance(m)
			}
			out <- first{m, pos, err}
			return
		}
	}()
	eventually(t, 20*time.Second, "the following replay reading", reading.Load)
	produceTo(t, c, topic, 0, 3, 1)
	r := <-out
	if r.err != nil {
		t.Fatal(r.err)
	}
	saved, _ := json.Marshal(r.pos)
	info, _ := c.Topic(ctx, topic)
	want := `{"offsets":{"0":4,"1":2},"incarnation":` + `"` + info.Incarnation + `"}`
	if string(r.m.Bytes()) != "0:3" || string(saved) != want {
		t.Fatalf("first message %q, position %s; want 0:3 and %s", r.m.Bytes(), saved, want)
	}
}

// A following replay from FromEnd needs the end of each partition it starts at the end:
// while one is unavailable (its stats say 0) it reads the topic again rather than start
// that partition at 0.
func TestReplayFromEndWaitsForAnUnavailablePartitionsEnd(t *testing.T) {
	var reading atomic.Bool
	c, ft := newFaultClient(t, quickRetry(6), narad.WithObserver(func(e narad.Event) {
		if e.Kind == narad.EventRequest && e.Op == "read-messages" {
			reading.Store(true)
		}
	}))
	ctx := ctxT(t)
	topic := mustTopic(t, c, narad.TopicConfig{Partitions: 2})
	produceTo(t, c, topic, 0, 0, 3)
	produceTo(t, c, topic, 1, 0, 2)
	reads := partition1DownForTwoReads(t, ft, topic)
	out := make(chan *narad.Message, 1)
	go func() {
		for m, err := range c.Replay(ctx, topic, narad.FromEnd(), narad.Follow(), narad.WithFollowInterval(20*time.Millisecond)) {
			if err != nil {
				t.Error(err)
			}
			out <- m
			return
		}
	}()
	eventually(t, 20*time.Second, "the following replay reading", reading.Load)
	produceTo(t, newClient(t), topic, 1, 2, 1)
	if m := <-out; m == nil || string(m.Bytes()) != "1:2" {
		t.Fatalf("first message %v, want 1:2 (partition 1 started at its end, not at 0)", m)
	}
	if n := reads.Load(); n < 3 {
		t.Fatalf("the topic was read %d times, want 3 (twice unavailable, then available)", n)
	}
}
