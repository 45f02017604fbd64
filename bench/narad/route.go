package narad

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/narad-mq/narad/bench/load"
)

// RouteOptions are the parameters of MeasureRoutes.
type RouteOptions struct {
	Requests int // measured requests per route and operation
	Warmup   int // requests per route sent first and not measured
	Size     int // payload bytes
}

// Route operations.
const (
	RouteProduce    = "produce"
	RouteConsume    = "consume"
	RouteAck        = "ack"
	RouteConsumeAck = "consume+ack"
)

// Route is the latency of one operation sent to the cluster's first node for a
// partition that node holds (Local) and for one another node holds (Forwarded).
type Route struct {
	Op     string `json:"op"`
	Entry  string `json:"entry_node"`   // the node every request was sent to
	Holder string `json:"forwarded_to"` // the node holding the forwarded partition
	// Local and Forwarded are the latencies of the two routes (in nanoseconds).
	Local     load.Summary `json:"local"`
	Forwarded load.Summary `json:"forwarded"`
	Requests  int          `json:"requests_each"` // measured requests of each route
	Warmup    int          `json:"warmup_each"`   // unmeasured requests of each route before them
	Size      int          `json:"payload_bytes"`
}

// MeasureRoutes measures what forwarding adds to a request on a cluster: one client,
// one request at a time, every request sent to the first node.
//
//   - produce: a topic with one partition per node; each round produces one message to
//     the partition the first node holds and one to a partition another node holds
//     (?partition=N).
//   - consume and ack: two one-partition topics, one held by the first node and one by
//     another (topics are created until the placement gives both); each is filled with
//     enough messages beforehand, so every consume finds one waiting; each round
//     consumes one message of each and acks it, through the first node.
//
// The two routes alternate in every round, and which goes first alternates too, so a
// load that comes and goes on the machine falls on both alike. Any answer other than
// the expected 2xx, or a consume that finds nothing, ends the measurement with an
// error. The topics are deleted at the end.
func (t *Target) MeasureRoutes(ctx context.Context, o RouteOptions) ([]Route, error) {
	if len(t.ids) < 2 {
		return nil, errors.New("routes need a cluster of at least 2 nodes")
	}
	if o.Requests < 1 || o.Warmup < 0 || o.Size < 1 {
		return nil, fmt.Errorf("route options %+v: want at least 1 request, no negative warm-up, a payload", o)
	}
	var topics []string
	defer func() {
		for _, name := range topics {
			_ = t.deleteTopic(context.WithoutCancel(ctx), name) // the figures are taken; a leftover topic dies with the cluster
		}
	}()
	produce, err := t.produceRoutes(ctx, o, &topics)
	if err != nil {
		return nil, err
	}
	consume, err := t.consumeRoutes(ctx, o, &topics)
	if err != nil {
		return nil, err
	}
	return append([]Route{produce}, consume...), nil
}

// pair runs o.Warmup+o.Requests rounds of one local and one forwarded request,
// alternating which goes first; each is told whether its round is measured.
func pair(ctx context.Context, o RouteOptions, local, forwarded func(ctx context.Context, measured bool) error) error {
	for i := 0; i < o.Warmup+o.Requests; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		first, second := local, forwarded
		if i%2 == 1 {
			first, second = forwarded, local
		}
		measured := i >= o.Warmup
		if err := first(ctx, measured); err != nil {
			return err
		}
		if err := second(ctx, measured); err != nil {
			return err
		}
	}
	return nil
}

func (t *Target) produceRoutes(ctx context.Context, o RouteOptions, topics *[]string) (Route, error) {
	name, err := t.createTopic(ctx, len(t.ids))
	if err != nil {
		return Route{}, err
	}
	*topics = append(*topics, name)
	holders, err := t.Holders(ctx, name)
	if err != nil {
		return Route{}, err
	}
	local, remote := -1, -1
	for p, h := range holders {
		switch {
		case h == t.ids[0] && local < 0:
			local = p
		case h != t.ids[0] && remote < 0:
			remote = p
		}
	}
	if local < 0 || remote < 0 {
		return Route{}, fmt.Errorf("topic %s of %d partitions is placed %v: no partition on %s, or none elsewhere", name, len(holders), holders, t.ids[0])
	}
	r := Route{Op: RouteProduce, Entry: t.ids[0], Holder: holders[remote], Requests: o.Requests, Warmup: o.Warmup, Size: o.Size}
	payload := bytes.Repeat([]byte{'x'}, o.Size)
	var rec [2]load.Recorder
	send := func(p int, rec *load.Recorder) func(context.Context, bool) error {
		c := t.clientAt(t.base, name)
		c.produce += "?partition=" + strconv.Itoa(p)
		return func(ctx context.Context, measured bool) error {
			t0 := time.Now()
			if err := c.Produce(ctx, payload); err != nil {
				return fmt.Errorf("produce to partition %d (held by %s) via %s: %w", p, holders[p], t.ids[0], err)
			}
			if measured {
				rec.Add(time.Since(t0))
			}
			return nil
		}
	}
	if err := pair(ctx, o, send(local, &rec[0]), send(remote, &rec[1])); err != nil {
		return Route{}, err
	}
	r.Local, r.Forwarded = load.Summarize(&rec[0]), load.Summarize(&rec[1])
	return r, nil
}

func (t *Target) consumeRoutes(ctx context.Context, o RouteOptions, topics *[]string) ([]Route, error) {
	// One-partition topics go to the node holding the fewest partitions, so a few
	// creates give one on the first node and one elsewhere.
	var local, remote, remoteHolder string
	for tries := 0; (local == "" || remote == "") && tries < 3*len(t.ids); tries++ {
		name, err := t.createTopic(ctx, 1)
		if err != nil {
			return nil, err
		}
		*topics = append(*topics, name)
		holders, err := t.Holders(ctx, name)
		if err != nil {
			return nil, err
		}
		switch {
		case holders[0] == t.ids[0] && local == "":
			local = name
		case holders[0] != t.ids[0] && remote == "":
			remote, remoteHolder = name, holders[0]
		}
	}
	if local == "" || remote == "" {
		return nil, fmt.Errorf("%d one-partition topics did not give one held by %s and one held elsewhere", 3*len(t.ids), t.ids[0])
	}
	for _, name := range []string{local, remote} {
		if err := t.fill(ctx, name, o.Warmup+o.Requests, o.Size); err != nil {
			return nil, err
		}
	}
	var cons, acks, both [2]load.Recorder
	take := func(name string, k int) func(context.Context, bool) error {
		c := t.clientAt(t.base, name)
		return func(ctx context.Context, measured bool) error {
			t0 := time.Now()
			ds, err := c.Consume(ctx, 1, time.Second)
			if err != nil {
				return fmt.Errorf("consume from %s via %s: %w", name, t.ids[0], err)
			}
			if len(ds) != 1 {
				return fmt.Errorf("consume from %s via %s: %d messages, want the 1 waiting", name, t.ids[0], len(ds))
			}
			t1 := time.Now()
			if _, err := c.Ack(ctx, ds); err != nil {
				return fmt.Errorf("ack on %s via %s: %w", name, t.ids[0], err)
			}
			t2 := time.Now()
			if measured {
				cons[k].Add(t1.Sub(t0))
				acks[k].Add(t2.Sub(t1))
				both[k].Add(t2.Sub(t0))
			}
			return nil
		}
	}
	if err := pair(ctx, o, take(local, 0), take(remote, 1)); err != nil {
		return nil, err
	}
	route := func(op string, rec *[2]load.Recorder) Route {
		return Route{Op: op, Entry: t.ids[0], Holder: remoteHolder, Requests: o.Requests, Warmup: o.Warmup, Size: o.Size,
			Local: load.Summarize(&rec[0]), Forwarded: load.Summarize(&rec[1])}
	}
	return []Route{route(RouteConsume, &cons), route(RouteAck, &acks), route(RouteConsumeAck, &both)}, nil
}

// fill produces n messages of size bytes into topic in batches of 100, through the
// first node.
func (t *Target) fill(ctx context.Context, topic string, n, size int) error {
	c := t.clientAt(t.base, topic)
	batch := make([][]byte, 0, 100)
	for n > 0 {
		batch = batch[:0]
		for k := min(n, 100); k > 0; k-- {
			batch = append(batch, bytes.Repeat([]byte{'x'}, size))
		}
		if err := c.ProduceBatch(ctx, batch); err != nil {
			return fmt.Errorf("filling %s: %w", topic, err)
		}
		n -= len(batch)
	}
	return nil
}
