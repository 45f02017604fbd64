// Command replay rebuilds a read model from a topic's log, and keeps it up to date from a
// saved position. The topic `ledger` holds account events; the read model is each
// account's balance. Replay reads the log without leases, so it disturbs no consumer and
// can run any number of times.
//
// Each run: load the checkpoint (the model plus the narad.Position it reflects) or start
// empty at offset 0; produce --events new events; catch up by replaying from the saved
// position, applying each event once; save the checkpoint (write, then rename); and
// check the result against a full rebuild from offset 0.
//
//	go run ./replay --events 1000    # first run: no checkpoint, rebuild from offset 0
//	go run ./replay --events 200     # later runs: resume where the last one stopped
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"

	"github.com/narad-mq/narad/examples/internal/cli"
)

// Event moves money in or out of an account.
type Event struct {
	Account    string `json:"account"`
	DeltaCents int64  `json:"delta_cents"`
}

// Model is the read model: balances, and how many events made them.
type Model struct {
	Balances map[string]int64 `json:"balances"`
	Events   int64            `json:"events"`
}

func (m *Model) apply(msg *narad.Message) error {
	var e Event
	if err := msg.Decode(&e); err != nil {
		return fmt.Errorf("%d@%d: %w", msg.Partition, msg.Offset, err)
	}
	m.Balances[e.Account] += e.DeltaCents
	m.Events++
	return nil
}

// Checkpoint is what a run leaves for the next: the model and the position right after
// the last event it reflects. They are saved together, so they always agree.
type Checkpoint struct {
	Position narad.Position `json:"position"`
	Model    Model          `json:"model"`
}

func main() {
	topic := flag.String("topic", "ledger", "the event topic")
	events := flag.Int("events", 1000, "new events to produce before catching up (0: none)")
	path := flag.String("checkpoint", "ledger.checkpoint.json", "where the model and its position are saved")
	flag.Parse()
	ctx, stop := cli.SignalContext()
	defer stop()
	if err := run(ctx, *topic, *events, *path); err != nil {
		cli.Fatal(err)
	}
}

// replayInto applies every event from pos to the end of the log (as of the start) to m,
// advancing pos past each one.
func replayInto(ctx context.Context, c *narad.Client, topic string, pos *narad.Position, m *Model) error {
	for msg, err := range c.Replay(ctx, topic, *pos, narad.WithReplayBatch(1000)) {
		if err != nil {
			if narad.Retryable(err) && ctx.Err() == nil {
				continue // reported, and retried by the iterator
			}
			return err
		}
		if err := m.apply(msg); err != nil {
			return err
		}
		pos.Advance(msg)
	}
	return ctx.Err()
}

func load(path string) (*Checkpoint, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var cp Checkpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &cp, nil
}

// save writes the checkpoint to a temporary file and renames it over the old one, so a
// crash leaves the old checkpoint or the new one, never half of one.
func save(path string, cp *Checkpoint) error {
	data, err := json.MarshalIndent(cp, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".checkpoint-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone after the rename; left only when a step failed
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close() // the write error is the one to report
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close() // the sync error is the one to report
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func run(ctx context.Context, topic string, events int, path string) error {
	c, err := cli.Connect()
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // Client.Close always returns nil
	if _, err := c.EnsureTopic(ctx, topic, narad.TopicConfig{}); err != nil {
		return err
	}

	cp, err := load(path)
	if err != nil {
		return err
	}
	if cp == nil {
		cp = &Checkpoint{Position: narad.FromStart(), Model: Model{Balances: map[string]int64{}}}
		fmt.Printf("no checkpoint at %s: rebuilding from offset 0\n", path)
	} else {
		fmt.Printf("resuming from checkpoint %s: offsets %v, %d events applied so far\n", path, cp.Position.Offsets, cp.Model.Events)
	}

	if events > 0 {
		batch := make([]narad.Outgoing, events)
		for i := range batch {
			e := Event{Account: fmt.Sprintf("acct-%02d", rand.IntN(20)), DeltaCents: rand.Int64N(20001) - 10000}
			batch[i] = narad.Outgoing{Body: e, Key: e.Account}
		}
		if _, err := c.ProduceBatch(ctx, topic, batch); err != nil {
			return err
		}
		fmt.Printf("produced %d events to %s\n", events, topic)
	}

	start, before := time.Now(), cp.Model.Events
	if err := replayInto(ctx, c, topic, &cp.Position, &cp.Model); err != nil {
		return err
	}
	fmt.Printf("caught up: applied %d events in %s, now at offsets %v\n", cp.Model.Events-before, time.Since(start).Round(time.Millisecond), cp.Position.Offsets)
	if err := save(path, cp); err != nil {
		return err
	}
	fmt.Printf("saved checkpoint %s\n", path)

	// The proof: rebuilding from scratch gives the same model. (Events produced by
	// someone else since the catch-up would show here as a difference.)
	full := Model{Balances: map[string]int64{}}
	fullPos := narad.FromStart()
	start = time.Now()
	if err := replayInto(ctx, c, topic, &fullPos, &full); err != nil {
		return err
	}
	fmt.Printf("full rebuild from offset 0: %d events in %s\n", full.Events, time.Since(start).Round(time.Millisecond))
	if full.Events != cp.Model.Events || !maps.Equal(full.Balances, cp.Model.Balances) {
		return fmt.Errorf("the resumed model (%d events) differs from the full rebuild (%d events)", cp.Model.Events, full.Events)
	}
	var total int64
	for _, b := range full.Balances {
		total += b
	}
	fmt.Printf("read model matches the full rebuild: %d accounts, %d events, total balance %d cents\n", len(full.Balances), full.Events, total)
	return nil
}
