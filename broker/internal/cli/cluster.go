package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"

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
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	From      string `json:"from"`
	To        string `json:"to"`
	Status    string `json:"status"`
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
		{name: "moves", usage: "--topic T --partition P --from NODE --to NODE", args: 0,
			summary: "start moving one replica of a partition to another node (admin)",
			help:    "The broker answers at once; the move goes on in the background. A broker that does not offer moves yet says so (exit code 1).",
			setup: func(fs *flag.FlagSet) runFunc {
				topic := fs.String("topic", "", "the partition's topic")
				part := fs.Int("partition", -1, "the partition")
				from := fs.String("from", "", "node that holds the replica now")
				to := fs.String("to", "", "node to move it to")
				return func(ctx context.Context, e *env, args []string) error {
					if *topic == "" || *part < 0 || *from == "" || *to == "" {
						return usagef("a move needs --topic, --partition, --from and --to")
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
							return writeJSON(e.Stdout, moveJSON(*m))
						}
						fmt.Fprintf(e.Stdout, "%s/%d: %s -> %s %s\n", m.Topic, m.Partition, m.From, m.To, m.Status)
						return nil
					})
				}
			}},
		{name: "decommission", usage: "NODE", args: 1,
			summary: "move a node's partitions elsewhere, then remove it (admin)",
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
