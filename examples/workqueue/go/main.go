// Command workqueue is a work queue: a pool of workers takes jobs from a topic under
// leases, keeps the leases alive while a job runs longer than the topic's visibility
// timeout, acks each job when it is done, and drains on Ctrl-C or SIGTERM — running jobs
// finish and are acked, jobs never started go back to the queue, nothing is lost.
//
//	go run ./workqueue/go --jobs 20              # enqueue 20 jobs and work until Ctrl-C
//	go run ./workqueue/go --jobs 20 --exit-when-empty
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"

	"github.com/narad-mq/narad/examples/internal/cli"
)

// Job is what producers put on the queue.
type Job struct {
	ID     int    `json:"id"`
	Task   string `json:"task"`
	WorkMS int    `json:"work_ms"`
}

func main() {
	topic := flag.String("topic", "jobs", "the queue's topic (created when missing)")
	jobs := flag.Int("jobs", 0, "jobs to enqueue before working (0: only work)")
	workers := flag.Int("workers", 4, "jobs handled at once")
	work := flag.Duration("work", 4*time.Second, "how long each enqueued job takes")
	lease := flag.Duration("lease", 3*time.Second, "visibility timeout of the topic when this creates it; shorter than --work, so leases must be renewed")
	exitWhenEmpty := flag.Bool("exit-when-empty", false, "stop (draining) once the queue has no unsettled job left")
	flag.Parse()

	ctx, stop := cli.SignalContext()
	defer stop()
	if err := run(ctx, *topic, *jobs, *workers, *work, *lease, *exitWhenEmpty); err != nil {
		cli.Fatal(err)
	}
}

func run(ctx context.Context, topic string, jobs, workers int, work, lease time.Duration, exitWhenEmpty bool) error {
	c, err := cli.Connect()
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // Client.Close always returns nil

	info, err := c.EnsureTopic(ctx, topic, narad.TopicConfig{VisibilityTimeout: lease})
	if err != nil {
		return err
	}
	fmt.Printf("queue %s: %d partitions, lease %s, %d workers\n", topic, info.Partitions, info.VisibilityTimeout, workers)

	if jobs > 0 {
		batch := make([]narad.Outgoing, jobs)
		for i := range batch {
			batch[i] = narad.Outgoing{Body: Job{ID: i + 1, Task: fmt.Sprintf("resize image %d", i+1), WorkMS: int(work.Milliseconds())}}
		}
		if _, err := c.ProduceBatch(ctx, topic, batch); err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
		fmt.Printf("enqueued %d jobs\n", jobs)
	}

	var handled atomic.Int64
	handler := func(ctx context.Context, m *narad.Message) error {
		var j Job
		if err := m.Decode(&j); err != nil {
			return err // handed back; a real service would park it (see ../deadletter)
		}
		// ctx ends when the lease is lost (another worker may get the job: stop) or
		// when shutdown's grace period is over. Returning an error then is right: the
		// job was not done, and the Consumer never acks a message whose lease is lost.
		select {
		case <-time.After(time.Duration(j.WorkMS) * time.Millisecond):
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		n := handled.Add(1)
		fmt.Printf("job %d done (partition %d offset %d, delivery %d) [%d handled]\n", j.ID, m.Partition, m.Offset, m.DeliveryAttempt, n)
		return nil // the Consumer acks it, and confirms the ack
	}

	consumer := c.Consumer(topic, handler,
		narad.WithConcurrency(workers),
		narad.WithShutdownGrace(30*time.Second),
		narad.WithErrorHandler(func(err error) { fmt.Fprintln(os.Stderr, "consumer:", err) }))

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if exitWhenEmpty {
		cli.WhenEmpty(runCtx, c, topic, 500*time.Millisecond, func() {
			fmt.Println("queue empty: stopping")
			cancel()
		})
	}

	// Run returns once ctx is cancelled and the pool has drained, or on a terminal error.
	err = consumer.Run(runCtx)
	st := consumer.Stats()
	if ctx.Err() != nil {
		fmt.Println("signal received: drained")
	}
	fmt.Printf("handled %d jobs (lease renewals %d, leases lost %d, handed back %d)\n", handled.Load(), st.Renewals, st.Lost, st.Nacked)
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
