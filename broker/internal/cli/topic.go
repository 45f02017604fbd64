package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// topicJSON is a topic as --output json writes it: the API's field names, durations in
// milliseconds.
type topicJSON struct {
	Name                      string          `json:"name"`
	Incarnation               string          `json:"incarnation"`
	Partitions                int             `json:"partitions"`
	RetentionMs               int64           `json:"retention_ms"`
	VisibilityTimeoutMs       int64           `json:"visibility_timeout_ms"`
	MaxInFlightPerPartition   int             `json:"max_in_flight_per_partition"`
	MaxAckedAheadPerPartition int             `json:"max_acked_ahead_per_partition"`
	ReplicationFactor         int             `json:"replication_factor"`
	Schema                    json.RawMessage `json:"schema,omitempty"`
	Parent                    string          `json:"parent,omitempty"`
	FanoutDelayMs             int64           `json:"fanout_delay_ms,omitempty"`
	CreatedAt                 string          `json:"created_at"`
	PartitionStats            []statsJSON     `json:"partition_stats,omitempty"`
}

type statsJSON struct {
	Partition     int32    `json:"partition"`
	OldestOffset  int64    `json:"oldest_offset"`
	NextOffset    int64    `json:"next_offset"`
	HighWatermark int64    `json:"high_watermark"`
	AckFrontier   int64    `json:"ack_frontier"`
	AckedAhead    int64    `json:"acked_ahead"`
	InFlight      int64    `json:"in_flight"`
	Backlog       int64    `json:"backlog"`
	Leader        string   `json:"leader"`
	Replicas      []string `json:"replicas"`
}

func toTopicJSON(t *narad.TopicInfo) topicJSON {
	out := topicJSON{Name: t.Name, Incarnation: t.Incarnation, Partitions: t.Partitions,
		RetentionMs: t.Retention.Milliseconds(), VisibilityTimeoutMs: t.VisibilityTimeout.Milliseconds(),
		MaxInFlightPerPartition: t.MaxInFlightPerPartition, MaxAckedAheadPerPartition: t.MaxAckedAheadPerPartition,
		ReplicationFactor: t.ReplicationFactor, Schema: t.Schema, Parent: t.Parent,
		FanoutDelayMs: t.FanoutDelay.Milliseconds(), CreatedAt: t.CreatedAt.UTC().Format(time.RFC3339Nano)}
	for _, s := range t.Stats {
		out.PartitionStats = append(out.PartitionStats, statsJSON{Partition: s.Partition, OldestOffset: s.OldestOffset,
			NextOffset: s.NextOffset, HighWatermark: s.HighWatermark, AckFrontier: s.AckFrontier, AckedAhead: s.AckedAhead,
			InFlight: s.InFlight, Backlog: s.Backlog, Leader: s.Leader, Replicas: s.Replicas})
	}
	return out
}

// printTopics writes topics as a table (one row each), JSON (an array, or one object
// when single) or raw (their names, one a line).
func printTopics(e *env, ts []narad.TopicInfo, single bool) error {
	f, err := e.format()
	if err != nil {
		return err
	}
	switch f {
	case "json":
		if single {
			return writeJSON(e.Stdout, toTopicJSON(&ts[0]))
		}
		out := make([]topicJSON, len(ts))
		for i := range ts {
			out[i] = toTopicJSON(&ts[i])
		}
		return writeJSON(e.Stdout, out)
	case "raw":
		for _, t := range ts {
			fmt.Fprintln(e.Stdout, t.Name)
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPARTITIONS\tRETENTION\tVISIBILITY\tMAX IN FLIGHT\tPARENT")
	for _, t := range ts {
		parent := t.Parent
		if parent == "" {
			parent = "-"
		} else if t.FanoutDelay > 0 {
			parent += " (delay " + human(t.FanoutDelay) + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\n", t.Name, t.Partitions, human(t.Retention), human(t.VisibilityTimeout), t.MaxInFlightPerPartition, parent)
	}
	if single && len(ts[0].Stats) > 0 {
		fmt.Fprintln(tw, "\nPARTITION\tOLDEST\tNEXT\tACK FRONTIER\tIN FLIGHT\tBACKLOG\tLEADER")
		for _, s := range ts[0].Stats {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%s\n", s.Partition, s.OldestOffset, s.NextOffset, s.AckFrontier, s.InFlight, s.Backlog, s.Leader)
		}
	}
	return tw.Flush()
}

// schemaFlag reads --schema: inline JSON, or @file.
func schemaFlag(v string) (json.RawMessage, error) {
	if v == "" {
		return nil, nil
	}
	b := []byte(v)
	if strings.HasPrefix(v, "@") {
		var err error
		if b, err = os.ReadFile(v[1:]); err != nil {
			return nil, usagef("--schema: %v", err)
		}
	}
	if !json.Valid(b) {
		return nil, usagef("--schema is not valid JSON (give the schema inline or as @file)")
	}
	return b, nil
}

func topicCommands() []*command {
	return []*command{
		{name: "create", usage: "NAME [flags]", args: 1, summary: "create a topic",
			help: "Durations are Go durations: 90s, 30m, 12h, 168h. Zero values take the broker's defaults.",
			setup: func(fs *flag.FlagSet) runFunc {
				var cfg narad.TopicConfig
				var schema string
				fs.IntVar(&cfg.Partitions, "partitions", 0, "partition count, fixed after create (default: the broker's)")
				fs.DurationVar(&cfg.Retention, "retention", 0, "how long messages are kept, e.g. 12h")
				fs.DurationVar(&cfg.VisibilityTimeout, "visibility", 0, "lease length of consumed messages, e.g. 30s")
				fs.IntVar(&cfg.MaxInFlightPerPartition, "max-in-flight", 0, "unacked leases per partition")
				fs.IntVar(&cfg.MaxAckedAheadPerPartition, "max-acked-ahead", 0, "messages settled past the ack frontier per partition")
				fs.IntVar(&cfg.ReplicationFactor, "replication-factor", 0, "replicas per partition")
				fs.StringVar(&schema, "schema", "", "JSON Schema every payload must match: inline JSON or @file")
				fs.StringVar(&cfg.Parent, "parent", "", "create it as a fan-out child of this topic")
				fs.DurationVar(&cfg.FanoutDelay, "delay", 0, "with --parent: delay each copy by this much (a delay child)")
				return func(ctx context.Context, e *env, args []string) error {
					var err error
					if cfg.Schema, err = schemaFlag(schema); err != nil {
						return err
					}
					if cfg.FanoutDelay > 0 && cfg.Parent == "" {
						return usagef("--delay needs --parent")
					}
					return e.withClient(ctx, func(c *narad.Client) error {
						t, err := c.CreateTopic(ctx, args[0], cfg)
						if err != nil {
							return err
						}
						return printTopics(e, []narad.TopicInfo{*t}, true)
					})
				}
			}},
		{name: "list", usage: "", args: 0, summary: "list the topics",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					return e.withClient(ctx, func(c *narad.Client) error {
						ts, err := c.Topics(ctx)
						if err != nil {
							return err
						}
						return printTopics(e, ts, false)
					})
				}
			}},
		{name: "get", usage: "NAME", args: 1, summary: "a topic's settings and per-partition stats",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					return e.withClient(ctx, func(c *narad.Client) error {
						t, err := c.Topic(ctx, args[0])
						if err != nil {
							return err
						}
						return printTopics(e, []narad.TopicInfo{*t}, true)
					})
				}
			}},
		{name: "alter", usage: "NAME [flags]", args: 1, summary: "change a topic's live settings",
			setup: func(fs *flag.FlagSet) runFunc {
				var retention, visibility time.Duration
				var inFlight, ackedAhead, rf int
				var schema string
				fs.DurationVar(&retention, "retention", 0, "new retention, e.g. 12h")
				fs.DurationVar(&visibility, "visibility", 0, "new lease length, e.g. 30s")
				fs.IntVar(&inFlight, "max-in-flight", 0, "new in-flight cap per partition")
				fs.IntVar(&ackedAhead, "max-acked-ahead", 0, "new acked-ahead cap per partition")
				fs.IntVar(&rf, "replication-factor", 0, "new copies per partition (1 to 7), reached by moves in the background (`narad cluster moves`)")
				fs.StringVar(&schema, "schema", "", "new JSON Schema (inline or @file; {} removes it)")
				return func(ctx context.Context, e *env, args []string) error {
					var u narad.TopicUpdate
					set := map[string]bool{}
					fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
					if set["retention"] {
						u.Retention = &retention
					}
					if set["visibility"] {
						u.VisibilityTimeout = &visibility
					}
					if set["max-in-flight"] {
						u.MaxInFlightPerPartition = &inFlight
					}
					if set["max-acked-ahead"] {
						u.MaxAckedAheadPerPartition = &ackedAhead
					}
					if set["replication-factor"] {
						u.ReplicationFactor = &rf
					}
					var err error
					if u.Schema, err = schemaFlag(schema); err != nil {
						return err
					}
					if u.Retention == nil && u.VisibilityTimeout == nil && u.MaxInFlightPerPartition == nil && u.MaxAckedAheadPerPartition == nil && u.Schema == nil && u.ReplicationFactor == nil {
						return usagef("nothing to change: give --retention, --visibility, --max-in-flight, --max-acked-ahead, --replication-factor or --schema")
					}
					return e.withClient(ctx, func(c *narad.Client) error {
						t, err := c.AlterTopic(ctx, args[0], u)
						if err != nil {
							return err
						}
						return printTopics(e, []narad.TopicInfo{*t}, true)
					})
				}
			}},
		{name: "force-leader", usage: "NAME PARTITION --node NODE", args: 2,
			summary: "make NODE's replica the only one of a partition that lost its majority for good (admin; may lose messages)",
			help: "A last resort when a majority of the partition's replicas is gone for good. Messages only the lost replicas held are lost; " +
				"the answer gives a lower bound of how many. The old members are refused as replicas until their data is wiped, and the " +
				"replica set grows back to the topic's replication factor by moves. Do not repeat it blindly: check `narad topic get` first.",
			setup: func(fs *flag.FlagSet) runFunc {
				node := fs.String("node", "", "the live node whose replica takes over")
				return func(ctx context.Context, e *env, args []string) error {
					part, err := strconv.ParseInt(args[1], 10, 32)
					if err != nil || part < 0 {
						return usagef("partition %q: want a partition number, from 0", args[1])
					}
					if *node == "" {
						return usagef("name the node whose replica takes over with --node")
					}
					f, err := e.format()
					if err != nil {
						return err
					}
					return e.withClient(ctx, func(c *narad.Client) error {
						r, err := c.ForceLeader(ctx, args[0], int32(part), *node)
						if err != nil {
							return offered("forced takeovers", err)
						}
						if f == "json" {
							return writeJSON(e.Stdout, struct {
								PossiblyLostAtLeast int64    `json:"possibly_lost_at_least"`
								Replicas            []string `json:"replicas"`
							}{r.PossiblyLostAtLeast, r.Replicas})
						}
						fmt.Fprintf(e.Stdout, "%s/%d: led by %s; replicas %s; possibly lost: at least %d messages\n",
							args[0], part, *node, strings.Join(r.Replicas, ","), r.PossiblyLostAtLeast)
						return nil
					})
				}
			}},
		{name: "delete", usage: "NAME", args: 1, summary: "delete a topic and its messages",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					return e.withClient(ctx, func(c *narad.Client) error {
						if err := c.DeleteTopic(ctx, args[0]); err != nil {
							return err
						}
						return printDone(e, map[string]string{"deleted": args[0]})
					})
				}
			}},
		{name: "children", usage: "PARENT", args: 1, summary: "list a topic's fan-out children and their lag",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					return e.withClient(ctx, func(c *narad.Client) error {
						cs, err := c.Children(ctx, args[0])
						if err != nil {
							return err
						}
						return printChildren(e, cs)
					})
				}
			}},
		{name: "attach", usage: "PARENT CHILD [--delay D | --remote-url URL --remote-user U [--remote-password-file F] [--remote-ca-file F] [--start now|earliest]]", args: 2,
			summary: "make CHILD (with --remote-url, a topic of another cluster) receive a copy of every message committed to PARENT from now on",
			setup: func(fs *flag.FlagSet) runFunc {
				delay := fs.Duration("delay", 0, "delay each copy by this much (a delay child)")
				var rs remoteFlags
				rs.register(fs)
				return func(ctx context.Context, e *env, args []string) error {
					if rs.url != "" {
						return attachRemote(ctx, e, args[0], args[1], rs)
					}
					if rs.given() {
						return usagef("--remote-user, --remote-password-file, --remote-ca-file and --start need --remote-url")
					}
					return e.withClient(ctx, func(c *narad.Client) error {
						ch, err := c.AttachChild(ctx, args[0], args[1], *delay)
						if err != nil {
							return err
						}
						return printChildren(e, []narad.Child{*ch})
					})
				}
			}},
		{name: "pause", usage: "PARENT ID", args: 2, summary: "pause the copy to a remote child (ID remote:<n>, from children); the cursor stays",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					return e.withClient(ctx, func(c *narad.Client) error {
						if err := c.PauseChild(ctx, args[0], args[1]); err != nil {
							return err
						}
						return printDone(e, map[string]string{"paused": args[1], "parent": args[0]})
					})
				}
			}},
		{name: "resume", usage: "PARENT ID", args: 2, summary: "resume a paused remote child's copy where it stopped",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					return e.withClient(ctx, func(c *narad.Client) error {
						if err := c.ResumeChild(ctx, args[0], args[1]); err != nil {
							return err
						}
						return printDone(e, map[string]string{"resumed": args[1], "parent": args[0]})
					})
				}
			}},
		{name: "remote-password", usage: "PARENT ID [--remote-password-file F]", args: 2,
			summary: "give a remote child (ID remote:<n>) the remote user's new password (from the file, else NARAD_REMOTE_PASSWORD); the copy goes on from its cursor",
			setup: func(fs *flag.FlagSet) runFunc {
				file := fs.String("remote-password-file", "", "file holding the remote user's new password (else NARAD_REMOTE_PASSWORD)")
				return func(ctx context.Context, e *env, args []string) error {
					return setRemotePassword(ctx, e, args[0], args[1], *file)
				}
			}},
		{name: "remote-update", usage: "PARENT ID [--remote-url URL] [--remote-user U] [--remote-password-file F] [--remote-ca-file F | --remote-system-ca]", args: 2,
			summary: "change in place how a remote child (ID remote:<n>) reaches its remote: URL, user (with its password), password, CA certificates; the copy goes on from its cursor",
			setup: func(fs *flag.FlagSet) runFunc {
				var o remoteUpdateFlags
				fs.StringVar(&o.url, "remote-url", "", "the remote cluster's new base URL (the same cluster and topic, reached elsewhere)")
				fs.StringVar(&o.user, "remote-user", "", "the remote user the copy produces as from now on")
				fs.StringVar(&o.passwordFile, "remote-password-file", "", "file holding the remote user's password (else NARAD_REMOTE_PASSWORD); every change sends it: the stored one never goes to a new URL or CA")
				fs.StringVar(&o.caFile, "remote-ca-file", "", "PEM file of the CA certificates to trust for the https remote from now on")
				fs.BoolVar(&o.systemCA, "remote-system-ca", false, "trust the system's CAs for the https remote again, instead of the CA certificates given before")
				return func(ctx context.Context, e *env, args []string) error {
					return updateRemote(ctx, e, args[0], args[1], o)
				}
			}},
		{name: "detach", usage: "PARENT CHILD", args: 2, summary: "stop copying PARENT's messages to CHILD (a topic, or a remote child's ID remote:<n>)",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					return e.withClient(ctx, func(c *narad.Client) error {
						if err := c.DetachChild(ctx, args[0], args[1]); err != nil {
							return err
						}
						return printDone(e, map[string]string{"detached": args[1], "parent": args[0]})
					})
				}
			}},
	}
}

// printDone reports a command that has no object to show: nothing in table and raw
// form (the exit code says it), a small object in JSON.
func printDone(e *env, v map[string]string) error {
	f, err := e.format()
	if err != nil || f != "json" {
		return err
	}
	return writeJSON(e.Stdout, v)
}

type childJSON struct {
	Name          string           `json:"name"`
	ID            string           `json:"id,omitempty"`
	Remote        *narad.RemoteEnd `json:"remote,omitempty"`
	FanoutDelayMs int64            `json:"fanout_delay_ms"`
	State         string           `json:"state,omitempty"`
	PausedReason  string           `json:"paused_reason,omitempty"`
	Lag           []lagJSON        `json:"lag"`
}

type lagJSON struct {
	Partition        int32   `json:"partition"`
	ParentNextOffset int64   `json:"parent_next_offset"`
	ChildCursor      int64   `json:"child_cursor"`
	Lag              int64   `json:"lag"`
	LagSeconds       float64 `json:"lag_seconds,omitempty"`
	State            string  `json:"state,omitempty"`
	Reason           string  `json:"reason,omitempty"`
	LastError        string  `json:"last_error,omitempty"`
	Expired          int64   `json:"expired,omitempty"`
}

func printChildren(e *env, cs []narad.Child) error {
	f, err := e.format()
	if err != nil {
		return err
	}
	switch f {
	case "json":
		out := make([]childJSON, len(cs))
		for i, c := range cs {
			out[i] = childJSON{Name: c.Name, ID: c.ID, Remote: c.Remote, FanoutDelayMs: c.FanoutDelay.Milliseconds(), State: c.State, PausedReason: c.PausedReason, Lag: []lagJSON{}}
			for _, l := range c.Lag {
				out[i].Lag = append(out[i].Lag, lagJSON{Partition: l.Partition, ParentNextOffset: l.ParentNextOffset, ChildCursor: l.ChildCursor, Lag: l.Lag,
					LagSeconds: l.LagSeconds, State: l.State, Reason: l.Reason, LastError: l.LastError, Expired: l.Expired})
			}
		}
		return writeJSON(e.Stdout, out)
	case "raw":
		for _, c := range cs {
			fmt.Fprintln(e.Stdout, c.Name)
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHILD\tID\tREMOTE\tDELAY\tSTATE\tLAG")
	var why []string
	for _, c := range cs {
		var lag int64
		for _, l := range c.Lag {
			lag += l.Lag
		}
		state, id, remote := c.State, c.ID, "-"
		if state == "" {
			state = "-"
		}
		if id == "" {
			id = c.Name
		}
		if c.Remote != nil {
			remote = c.Remote.URL
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", c.Name, id, remote, human(c.FanoutDelay), state, lag)
		if c.PausedReason != "" {
			why = append(why, id+": "+c.PausedReason)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, w := range why {
		fmt.Fprintln(e.Stdout, w)
	}
	return nil
}
