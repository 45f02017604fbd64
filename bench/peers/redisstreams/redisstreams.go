// Package redisstreams is the benchmark's Redis Streams target: one redis-server
// process with the append-only file on and fsynced on every write, driven with
// github.com/redis/go-redis/v9 over a pool of connections.
//
// How the shapes map onto Redis Streams:
//
//   - a queue of P partitions is P stream keys, each with one consumer group
//     (XGROUP CREATE ... MKSTREAM).
//   - produce is XADD (one field, the payload); a producer rotates over the keys. A
//     batch is that many XADDs to one key in one pipeline.
//   - consume is XREADGROUP GROUP g <consumer> COUNT n BLOCK <wait> STREAMS key >.
//     Consumer i is pinned to key i mod P when there are at least as many consumers as
//     keys, otherwise it rotates (one key per call, so COUNT bounds the answer).
//   - ack is XACK, one command for every id of a batch.
//
// Redis runs with appendonly yes and appendfsync always: the AOF is written and
// fsynced before the replies of the commands an event-loop round executed, so an
// XADD or XACK reply means durable, like narad's 202 and 204. RDB snapshots are off
// (save ""). Redis executes commands on one thread.
package redisstreams

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/bench/load"
	"github.com/narad-mq/narad/bench/proc"
	"github.com/redis/go-redis/v9"
)

const (
	readyTimeout = 30 * time.Second
	group        = "bench"
	field        = "d"
)

// Find returns the redis-server to run: $REDIS_SERVER when set, else redis-server on
// PATH; ok is false when there is none.
func Find() (string, bool) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, true
	}
	p, err := exec.LookPath("redis-server")
	return p, err == nil
}

// Options configures Launch.
type Options struct {
	Server  string    // redis-server binary
	DataDir string    // the AOF and the log
	Pool    int       // connection pool size (at least 32)
	Log     io.Writer // the server's stdout and stderr
}

// Target drives one redis-server. It implements load.Target.
type Target struct {
	node   *proc.Process
	rdb    *redis.Client
	prefix string
	seq    atomic.Int64
}

var _ load.Target = (*Target)(nil)

// Launch starts redis-server on a free loopback port and connects a pool.
func Launch(o Options) (*Target, error) {
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	port := addr[len("127.0.0.1:"):]
	if _, err := strconv.Atoi(port); err != nil {
		return nil, fmt.Errorf("free address %s: %w", addr, err)
	}
	cmd := exec.Command(o.Server,
		"--port", port, "--bind", "127.0.0.1", "--protected-mode", "no",
		"--dir", o.DataDir, "--logfile", "redis.log", "--daemonize", "no",
		"--appendonly", "yes", "--appendfsync", "always", "--save", "")
	t := &Target{prefix: randomHex()}
	t.rdb = redis.NewClient(&redis.Options{
		Addr: addr, PoolSize: max(o.Pool, 32), MinIdleConns: 8,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
	})
	t.node, err = proc.Start(cmd, o.Log, readyTimeout, func(ctx context.Context) error {
		return t.rdb.Ping(ctx).Err()
	})
	if err != nil {
		_ = t.rdb.Close() // the start error is the one to report
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	return t, nil
}

func randomHex() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Name is "redis".
func (t *Target) Name() string { return "redis" }

// PID is the redis-server process.
func (t *Target) PID() int { return t.node.PID() }

// Close disconnects and stops the server.
func (t *Target) Close() error {
	err := t.rdb.Close()
	t.node.Stop()
	return err
}

// Open creates partitions stream keys, each with the consumer group.
func (t *Target) Open(ctx context.Context, partitions int) (load.Queue, error) {
	n := t.seq.Add(1)
	q := &queue{t: t}
	for p := 0; p < partitions; p++ {
		key := fmt.Sprintf("bench:%s:%d:p%d", t.prefix, n, p)
		if err := t.rdb.XGroupCreateMkStream(ctx, key, group, "$").Err(); err != nil {
			return nil, fmt.Errorf("create group on %s: %w", key, err)
		}
		q.keys = append(q.keys, key)
	}
	return q, nil
}

type queue struct {
	t    *Target
	keys []string
}

func (q *queue) Producer(i int) load.Producer { return &producer{q: q, next: i} }

func (q *queue) Consumer(i, n int) load.Consumer {
	return &consumer{q: q, i: i, pinned: n >= len(q.keys), name: "c" + strconv.Itoa(i)}
}

// Delete deletes the keys.
func (q *queue) Delete(ctx context.Context) error {
	return q.t.rdb.Del(ctx, q.keys...).Err()
}

type producer struct {
	q    *queue
	next int
}

func (p *producer) key() string {
	k := p.q.keys[p.next%len(p.q.keys)]
	p.next++
	return k
}

// Produce is one XADD.
func (p *producer) Produce(ctx context.Context, payload []byte) error {
	return p.q.t.rdb.XAdd(ctx, &redis.XAddArgs{Stream: p.key(), Values: []any{field, payload}}).Err()
}

// ProduceBatch pipelines one XADD per payload to one key.
func (p *producer) ProduceBatch(ctx context.Context, payloads [][]byte) error {
	key := p.key()
	cmds, err := p.q.t.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for _, b := range payloads {
			pl.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{field, b}})
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

type consumer struct {
	q      *queue
	i      int
	pinned bool
	name   string
	turn   int
}

func (c *consumer) part() int {
	if c.pinned {
		return c.i % len(c.q.keys)
	}
	c.turn++
	return (c.i + c.turn) % len(c.q.keys)
}

// Consume is one XREADGROUP ... COUNT max BLOCK wait on one key.
func (c *consumer) Consume(ctx context.Context, maxN int, wait time.Duration) ([]load.Delivery, error) {
	p := c.part()
	res, err := c.q.t.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: c.name, Streams: []string{c.q.keys[p], ">"}, Count: int64(maxN), Block: wait,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []load.Delivery
	for _, s := range res {
		for _, m := range s.Messages {
			v, _ := m.Values[field].(string)
			out = append(out, load.Delivery{Payload: []byte(v), Handle: m.ID, Part: p})
		}
	}
	return out, nil
}

// Ack is one XACK of every id, per key (one key when the deliveries came from one
// Consume).
func (c *consumer) Ack(ctx context.Context, ds []load.Delivery) (int, error) {
	byKey := make(map[int][]string, 1)
	for _, d := range ds {
		byKey[d.Part] = append(byKey[d.Part], d.Handle)
	}
	var (
		n     int
		first error
	)
	for p, ids := range byKey {
		got, err := c.q.t.rdb.XAck(ctx, c.q.keys[p], group, ids...).Result()
		n += int(got)
		if err == nil && int(got) != len(ids) {
			err = fmt.Errorf("XACK %s: %d of %d ids acknowledged", c.q.keys[p], got, len(ids))
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return n, first
}
