package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"text/tabwriter"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

type memberJSON struct {
	ID             string `json:"id"`
	Address        string `json:"address"`
	HTTPAddress    string `json:"http_address,omitempty"`
	Status         string `json:"status"`
	Voter          bool   `json:"voter"`
	PartitionsHeld int    `json:"partitions_held"`
	PartitionsLed  int    `json:"partitions_led"`
	Controller     bool   `json:"controller"`
	// MinVersion and MaxVersion are the cluster versions the member speaks (0: its
	// broker does not say).
	MinVersion int `json:"min_version,omitempty"`
	MaxVersion int `json:"max_version,omitempty"`
}

type moveJSON struct {
	ID        string  `json:"id"`
	Topic     string  `json:"topic"`
	Partition int32   `json:"partition"`
	From      string  `json:"from"`
	To        string  `json:"to"`
	Status    string  `json:"status"`
	Reason    string  `json:"reason,omitempty"`
	Cause     string  `json:"cause"`
	Progress  float64 `json:"progress"`
	Lag       int64   `json:"lag,omitempty"`
	Created   string  `json:"created_at"`
	Updated   string  `json:"updated_at"`
}

func toMoveJSON(m narad.Move) moveJSON {
	return moveJSON{ID: m.ID, Topic: m.Topic, Partition: m.Partition, From: m.From, To: m.To, Status: m.Status,
		Reason: m.Reason, Cause: m.Cause, Progress: m.Progress, Lag: m.Lag,
		Created: m.Created.UTC().Format(time.RFC3339), Updated: m.Updated.UTC().Format(time.RFC3339)}
}

// printMoves writes moves as a table (one line each, its reason under a failed one),
// JSON, or their ids (raw).
func printMoves(e *env, f string, ms []narad.Move) error {
	switch f {
	case "json":
		out := make([]moveJSON, len(ms))
		for i, m := range ms {
			out[i] = toMoveJSON(m)
		}
		return writeJSON(e.Stdout, out)
	case "raw":
		for _, m := range ms {
			fmt.Fprintln(e.Stdout, m.ID)
		}
		return nil
	}
	if len(ms) == 0 {
		fmt.Fprintln(e.Stdout, "no moves")
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPARTITION\tFROM\tTO\tSTATUS\tCAUSE\tPROGRESS\tLAG\tUPDATED")
	for _, m := range ms {
		lag := "-"
		if m.Status == narad.MoveCopying {
			lag = fmt.Sprint(m.Lag)
		}
		fmt.Fprintf(tw, "%s\t%s/%d\t%s\t%s\t%s\t%s\t%.0f%%\t%s\t%s\n", m.ID, m.Topic, m.Partition, firstNonEmpty(m.From, "-"), firstNonEmpty(m.To, "-"),
			m.Status, m.Cause, 100*m.Progress, lag, m.Updated.UTC().Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, m := range ms {
		if m.Reason != "" {
			fmt.Fprintf(e.Stdout, "%s %s: %s\n", m.ID, m.Status, m.Reason)
		}
	}
	return nil
}

// offered turns the broker's 501 into a sentence: the command exists, this broker
// does not offer it yet (exit code 1).
func offered(what string, err error) error {
	if errors.Is(err, narad.ErrNotImplemented) {
		return fmt.Errorf("this broker does not offer %s yet: %w", what, err)
	}
	return err
}

func clusterCommands() []*command {
	return []*command{
		{name: "members", usage: "", args: 0, summary: "the cluster's members, their status and what they hold",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					f, err := e.format()
					if err != nil {
						return err
					}
					return e.withClient(ctx, func(c *narad.Client) error {
						info, err := c.Cluster(ctx)
						if err != nil {
							return err
						}
						out := make([]memberJSON, len(info.Members))
						for i, m := range info.Members {
							out[i] = memberJSON{ID: m.ID, Address: m.Address, HTTPAddress: m.HTTPAddress, Status: m.Status,
								Voter: m.Voter, PartitionsHeld: m.PartitionsHeld, PartitionsLed: m.PartitionsLed, Controller: m.ID == info.Controller,
								MinVersion: m.MinVersion, MaxVersion: m.MaxVersion}
						}
						switch f {
						case "json":
							return writeJSON(e.Stdout, out)
						case "raw":
							for _, m := range out {
								fmt.Fprintln(e.Stdout, m.ID)
							}
							return nil
						}
						tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
						if info.Version > 0 {
							fmt.Fprintf(e.Stdout, "cluster version %d\n", info.Version)
						}
						fmt.Fprintln(tw, "ID\tSTATUS\tROLE\tADDRESS\tHTTP\tHELD\tLED\tVERSIONS")
						for _, m := range out {
							role := "voter"
							switch {
							case m.Controller:
								role = "controller"
							case !m.Voter:
								role = "non-voter"
							}
							versions := "-"
							if m.MaxVersion > 0 {
								versions = fmt.Sprintf("%d-%d", m.MinVersion, m.MaxVersion)
							}
							fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", m.ID, m.Status, role, m.Address, firstNonEmpty(m.HTTPAddress, "-"), m.PartitionsHeld, m.PartitionsLed, versions)
						}
						return tw.Flush()
					})
				}
			}},
		{name: "moves", usage: "", args: 0, summary: "partition moves, under way and ended, with their progress (admin)",
			help: "Newest first. A move goes copying, switching, removing, done; it can be cancelled only while copying.",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					f, err := e.format()
					if err != nil {
						return err
					}
					return e.withClient(ctx, func(c *narad.Client) error {
						ms, err := c.Moves(ctx)
						if err != nil {
							return offered("partition moves", err)
						}
						return printMoves(e, f, ms)
					})
				}
			}},
		{name: "move", usage: "--topic T --partition P --from NODE --to NODE", args: 0,
			summary: "start moving one replica of a partition to another node (admin)",
			help: "The broker answers at once; the move goes on in the background (follow it with `narad cluster moves`). " +
				"Running it again while that move is under way answers the same move.",
			setup: func(fs *flag.FlagSet) runFunc {
				topic := fs.String("topic", "", "the partition's topic")
				part := fs.Int("partition", -1, "the partition")
				from := fs.String("from", "", "node that holds the replica now")
				to := fs.String("to", "", "node to move it to")
				return func(ctx context.Context, e *env, args []string) error {
					if *topic == "" || *part < 0 || *from == "" || *to == "" {
						return usagef("a move needs --topic, --partition, --from and --to")
					}
					if *part > math.MaxInt32 {
						return usagef("--partition %d: partitions count from 0 to the topic's partitions - 1", *part)
					}
					f, err := e.format()
					if err != nil {
						return err
					}
					return e.withClient(ctx, func(c *narad.Client) error {
						m, err := c.MovePartition(ctx, *topic, int32(*part), *from, *to)
						if err != nil {
							return offered("partition moves", err)
						}
						if f == "json" {
							return writeJSON(e.Stdout, toMoveJSON(*m))
						}
						fmt.Fprintf(e.Stdout, "%s: %s/%d %s -> %s %s\n", m.ID, m.Topic, m.Partition, m.From, m.To, m.Status)
						return nil
					})
				}
			}},
		{name: "cancel-move", usage: "ID", args: 1, summary: "cancel a partition move that is still copying (admin)",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					return e.withClient(ctx, func(c *narad.Client) error {
						if err := c.CancelMove(ctx, args[0]); err != nil {
							return offered("partition moves", err)
						}
						return printDone(e, map[string]string{"cancelled": args[0]})
					})
				}
			}},
		{name: "rebalance", usage: "", args: 0, summary: "start the moves that even out replicas and leaders over the members (admin)",
			help: "Prints the moves started now; the broker starts the rest as those finish. Running it again starts only what is still needed.",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					f, err := e.format()
					if err != nil {
						return err
					}
					return e.withClient(ctx, func(c *narad.Client) error {
						ms, err := c.Rebalance(ctx)
						if err != nil {
							return offered("rebalancing", err)
						}
						if f == "table" && len(ms) == 0 {
							fmt.Fprintln(e.Stdout, "nothing to move: the cluster is balanced, or its moves are under way")
							return nil
						}
						return printMoves(e, f, ms)
					})
				}
			}},
		{name: "decommission", usage: "NODE", args: 1,
			summary: "move a node's partitions elsewhere, then remove it (admin)",
			help: "The node shows decommissioning in `narad cluster members` until its last replica has moved, then is gone. " +
				"A dead node's partitions are copied again from their other replicas.",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					f, err := e.format()
					if err != nil {
						return err
					}
					return e.withClient(ctx, func(c *narad.Client) error {
						m, err := c.Decommission(ctx, args[0])
						if err != nil {
							return offered("decommissioning", err)
						}
						if f == "json" {
							return writeJSON(e.Stdout, memberJSON{ID: m.ID, Address: m.Address, HTTPAddress: m.HTTPAddress, Status: m.Status,
								Voter: m.Voter, PartitionsHeld: m.PartitionsHeld, PartitionsLed: m.PartitionsLed})
						}
						fmt.Fprintf(e.Stdout, "%s: %s\n", m.ID, m.Status)
						return nil
					})
				}
			}},
	}
}
