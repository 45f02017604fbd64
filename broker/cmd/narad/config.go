package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	_ "net/http/pprof" // served only on --debug-addr
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/httpapi"
	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/reqid"
)

// config is everything `narad serve` takes. Each field is a flag, an environment
// variable NARAD_<FLAG> (upper case, - as _) and a key of the --config file, in that
// order of precedence.
type config struct {
	HTTPAddr          string
	DebugAddr         string
	AdminPassword     string
	Insecure          bool
	AllowedHosts      string
	TLSCert           string
	TLSKey            string
	ProtectMetrics    bool
	MetricsPublic     bool
	MaxLongPolls      int
	MaxPeerInflight   int
	MaxInflightBytes  int64
	ReadHeaderTimeout time.Duration
	MaxConns          int
	MaxConnsPerAddr   int
	AuthFailureDelay  time.Duration
	DataDir           string
	NodeID            string
	LogLevel          string
	LogFormat         string
	SegmentBytes      int64
	SnapshotEntries   int
	SyncMode          string
	RetentionInterval time.Duration
	StatsInterval     time.Duration
	Console           bool
	ShutdownGrace     time.Duration
	UpgradeFormat     bool

	// Cluster: see clusterconfig.go.
	ClusterAddr           string
	AdvertiseAddr         string
	AdvertiseClusterAddr  string
	Peers                 string
	Join                  string
	WaitForAdd            bool
	ClusterSecretFile     string
	ClusterSecret         string
	ClusterSecretNextFile string
	ClusterSecretNext     string
	ClusterVersionMax     int
	AutoRebalance         bool
	MaxMoves              int
	LeaderLeases          bool
	WALHoldProcessor      bool
	// secretFlags names the secret flags given on the command line (they show in ps).
	secretFlags []string
	// PrintConfig prints the effective configuration and exits (--print-config).
	PrintConfig bool
	// flags is the parsed flag set, whose values are this config's (for printConfig).
	flags *flag.FlagSet

	GCPercent     int
	Partitions    int
	Retention     time.Duration
	Visibility    time.Duration
	MaxInFlight   int
	MaxAckedAhead int
}

func defineFlags(fs *flag.FlagSet, c *config) *string {
	fs.StringVar(&c.HTTPAddr, "http-addr", "127.0.0.1:7942", "address the HTTP API listens on")
	fs.StringVar(&c.AdminPassword, "admin-password", "", "turns security on and seeds the user admin with this password on first start (prefer NARAD_ADMIN_PASSWORD: flags show in ps)")
	fs.BoolVar(&c.Insecure, "insecure", false, "allow a non-loopback --http-addr without authentication")
	fs.StringVar(&c.AllowedHosts, "allowed-hosts", "", "with security off, comma-separated Host names served besides loopback names and IP addresses (.example.com: its subdomains; *: any), against DNS rebinding")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "PEM certificate for HTTPS on --http-addr (reloaded on SIGHUP and when the files' contents change)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "PEM private key for --tls-cert")
	fs.BoolVar(&c.MetricsPublic, "metrics-public", false, "with security on, serve /metrics without credentials (by default it needs an admin's: its labels name every topic)")
	fs.BoolVar(&c.ProtectMetrics, "protect-metrics", false, "deprecated and without effect: with security on, /metrics needs an admin's credentials unless --metrics-public")
	fs.IntVar(&c.MaxLongPolls, "max-long-polls", 10000, "consumes that may wait at once; past it a waiting consume answers 503")
	fs.IntVar(&c.MaxPeerInflight, "max-peer-inflight", broker.DefaultMaxPeerInflight, "in a cluster, requests this node forwards to one other node at once; past it a request for that node's partitions answers 503")
	fs.Int64Var(&c.MaxInflightBytes, "max-inflight-bytes", httpapi.DefaultMaxInflightBytes, "request body bytes the node holds at once; past it a request answers 503 overloaded (0: no bound)")
	fs.DurationVar(&c.ReadHeaderTimeout, "read-header-timeout", 10*time.Second, "a client must send its request headers within this, and a new connection its first request's headers (cuts slowloris clients and idle HTTP/2 connections)")
	fs.IntVar(&c.MaxConns, "max-connections", 16384, "connections the HTTP port holds open at once (0: no limit); past it new connections are closed unserved")
	fs.IntVar(&c.MaxConnsPerAddr, "max-connections-per-address", 2048, "connections one client IP address may hold open at once (0: no limit; raise it behind a proxy that does not pool connections)")
	fs.DurationVar(&c.AuthFailureDelay, "auth-failure-delay", 2*time.Second, "longest delay before the next password check of a client that keeps failing to log in is hashed (0: none)")
	fs.StringVar(&c.DebugAddr, "debug-addr", "", "address for Go's pprof profiles (off when empty); it has no authentication, so a non-loopback address needs --insecure")
	fs.StringVar(&c.DataDir, "data-dir", "./data", "directory for all of the node's data")
	fs.StringVar(&c.NodeID, "node-id", "", "this node's id (default: generated on first start and kept in the data dir)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "text or json")
	fs.Int64Var(&c.SegmentBytes, "segment-bytes", 64<<20, "size at which a partition's log rolls to a new segment file")
	fs.IntVar(&c.SnapshotEntries, "replica-snapshot-entries", broker.DefaultSnapshotEntries, "entries a replicated partition's Raft log takes between two snapshots; the log is then cut to its last 2,048 entries (a quarter of this when that is fewer), and a replica further behind is sent the snapshot and fetches the messages it lacks")
	fs.StringVar(&c.SyncMode, "sync-mode", "wal", "wal: every partition's appends go through one write-ahead file, one fdatasync per round; group: partitions with writes waiting share one file-system sync (syncfs); file: one fdatasync per write")
	fs.BoolVar(&c.WALHoldProcessor, "wal-hold-processor", true, "with --sync-mode wal, each round's fdatasync keeps the writer's Go processor instead of handing it to the scheduler (faster rounds); the garbage collector waits for a sync under way, so a disk that hangs in one stops the whole node until it returns. Rounds sync the plain way for a second (longer while syncs stall for 100 ms or more) after any held sync of 20 ms or more, and with GOMAXPROCS 1. With it on, Go runs one processor more than the CPUs (unless GOMAXPROCS is set); false: always the plain way")
	fs.DurationVar(&c.RetentionInterval, "retention-interval", 10*time.Second, "how often retention deletes old segments")
	fs.DurationVar(&c.StatsInterval, "stats-interval", broker.DefaultStatsInterval, "how often the stats route (GET /v1/stats) samples each topic's rates and backlog; it keeps the last 90 samples in memory")
	fs.BoolVar(&c.Console, "console", true, "serve the web console at /console (static files; it calls the API with the credentials its user logs in with)")
	fs.BoolVar(&c.UpgradeFormat, "upgrade-format", false, "allow a data-directory format upgrade that only a backup can undo (upgrades that need it say so and refuse to start without it)")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 25*time.Second, "how long SIGTERM waits for requests in flight")
	fs.StringVar(&c.ClusterAddr, "cluster-addr", "", "UDP host:port of the node plane (QUIC): all node-to-node traffic, the control plane's Raft included; turns clustering on and needs a cluster secret")
	fs.StringVar(&c.AdvertiseAddr, "advertise-addr", "", "HTTP URL clients and other nodes are told for this node (default: http(s)://--http-addr; required when --http-addr is a wildcard address)")
	fs.StringVar(&c.AdvertiseClusterAddr, "advertise-cluster-addr", "", "host:port other nodes dial to reach this node's --cluster-addr (default: --cluster-addr; required when it is a wildcard address)")
	fs.StringVar(&c.Peers, "peers", "", "bootstrap a new cluster from this static list, id@host:port,... (cluster addresses; the same list on every listed node, this node included)")
	fs.StringVar(&c.Join, "join", "", "cluster address (host:port) of any member of an existing cluster to join")
	fs.BoolVar(&c.WaitForAdd, "wait-for-add", false, "with neither --peers nor --join, wait to be added by POST /v1/cluster/members instead of starting a cluster of one")
	fs.StringVar(&c.ClusterSecretFile, "cluster-secret-file", "", "file holding the cluster secret (at least 16 bytes; a final newline is ignored); reread on SIGHUP")
	fs.StringVar(&c.ClusterSecret, "cluster-secret", "", "the cluster secret itself (prefer --cluster-secret-file or NARAD_CLUSTER_SECRET: flags show in ps)")
	fs.StringVar(&c.ClusterSecretNextFile, "cluster-secret-next-file", "", "file holding the next cluster secret during a rotation (accepted and offered besides the current one; empty: none); reread on SIGHUP")
	fs.StringVar(&c.ClusterSecretNext, "cluster-secret-next", "", "the next cluster secret itself (prefer --cluster-secret-next-file or NARAD_CLUSTER_SECRET_NEXT: flags show in ps)")
	fs.BoolVar(&c.AutoRebalance, "auto-rebalance", true, "the controller moves partition replicas onto nodes that hold fewer (a node that joined) on its own; false: only POST /v1/cluster/rebalance does")
	fs.BoolVar(&c.LeaderLeases, "leader-leases", true, "a partition leader serves consumes under its leader lease instead of committing each consume's deliveries through a quorum first; false on a machine that may be frozen for over 0.4 s (a hypervisor that stops guests, live migration): a frozen leader's clock stops too")
	fs.IntVar(&c.MaxMoves, "max-moves", meta.DefaultMaxMoves, "how many partition moves the cluster runs at once (decommissions, rebalancing and replication factor changes start theirs within it)")
	fs.IntVar(&c.ClusterVersionMax, "cluster-version-max", 0, fmt.Sprintf("the highest cluster version this node offers (0: the highest it speaks, %d): lower it on every node during an upgrade to keep the cluster at the previous release's version, so a rollback stays possible (docs/operating/upgrades.md)", meta.VersionMax))
	fs.IntVar(&c.GCPercent, "gc-percent", 0, fmt.Sprintf("the highest target of Go's garbage collector, which runs when the heap has grown this many percent over what the last collection kept; the node lowers it, never below 100, so that the heap grows at most 128 MiB (25 to 10000; 0: %d, or Go's GOGC variable when it is set, which turns the tuning off): higher spends memory to save CPU", defaultGCPercent))
	fs.IntVar(&c.Partitions, "default-partitions", 3, "partitions of a topic created without a count")
	fs.DurationVar(&c.Retention, "default-retention", 7*24*time.Hour, "retention of a topic created without one")
	fs.DurationVar(&c.Visibility, "default-visibility-timeout", 30*time.Second, "lease length of a topic created without one")
	fs.IntVar(&c.MaxInFlight, "default-max-in-flight", 1024, "in-flight cap per partition of a topic created without one")
	fs.IntVar(&c.MaxAckedAhead, "default-max-acked-ahead", 1024, "acked-ahead cap per partition of a topic created without one")
	fs.BoolVar(&c.PrintConfig, "print-config", false, "print the effective configuration (flags, NARAD_* variables and --config file; secrets redacted) as YAML and exit without starting")
	return fs.String("config", "", "YAML file of flag names to values (flags and NARAD_* variables override it)")
}

// secretSettings are the settings whose values printConfig never shows.
var secretSettings = map[string]bool{"admin-password": true, "cluster-secret": true, "cluster-secret-next": true}

// notSettings are flags that are not part of a node's configuration.
var notSettings = map[string]bool{"config": true, "print-config": true}

// printConfig writes the effective configuration, one "name: value" line per setting
// in name order, as YAML a --config file takes; a secret shows as "(redacted)" when
// set, so the output can be pasted into a bug report.
func printConfig(w io.Writer, c config) error {
	root := &yaml.Node{Kind: yaml.MappingNode}
	c.flags.VisitAll(func(f *flag.Flag) {
		if notSettings[f.Name] {
			return
		}
		v := f.Value.String()
		if secretSettings[f.Name] && v != "" {
			v = "(redacted)"
		}
		val := &yaml.Node{Kind: yaml.ScalarNode, Value: v}
		if quoteValue(v) {
			val.Tag, val.Style = "!!str", yaml.DoubleQuotedStyle
		}
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: f.Name}, val)
	})
	out, err := yaml.Marshal(root)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "# narad %s: effective configuration (secrets redacted)\n%s", version, out)
	return err
}

// quoteValue reports whether a value must be quoted to be read back as the same text
// (the config file reads every value as text, so 3 and "3" are alike to it).
func quoteValue(v string) bool {
	return v == "" || strings.ContainsAny(v, ":#,[]{}&*!|>'\"%@`") || strings.TrimSpace(v) != v
}

func envName(flagName string) string {
	return "NARAD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// loadConfig parses args, then fills every flag not given on the command line from the
// environment, then from the config file.
func loadConfig(args []string, getenv func(string) string) (config, error) {
	var c config
	fs := flag.NewFlagSet("narad serve", flag.ContinueOnError)
	cfgFile := defineFlags(fs, &c)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: narad serve [flags]\n       narad serve --dev [flags]   a playground: loopback only, security off, data in a temporary directory removed at exit\n\nEvery flag can also be set as NARAD_<NAME> (e.g. NARAD_HTTP_ADDR) or in the --config file (--dev only on the command line).\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range []string{"cluster-secret", "cluster-secret-next"} {
		if set[name] {
			c.secretFlags = append(c.secretFlags, "--"+name)
		}
	}
	if !set["config"] {
		if v := getenv(envName("config")); v != "" {
			*cfgFile = v
		}
	}
	fileVals := map[string]string{}
	if *cfgFile != "" {
		raw, err := os.ReadFile(*cfgFile)
		if err != nil {
			return c, fmt.Errorf("reading config: %w", err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(raw, &m); err != nil {
			return c, fmt.Errorf("config %s: %w", *cfgFile, err)
		}
		for k, v := range m {
			if fs.Lookup(k) == nil || notSettings[k] {
				return c, fmt.Errorf("config %s: unknown setting %q", *cfgFile, k)
			}
			fileVals[k] = fmt.Sprint(v)
		}
	}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || notSettings[f.Name] {
			return // --config is read above; --print-config only from the command line
		}
		src, v := envName(f.Name), getenv(envName(f.Name))
		if v == "" {
			src, v = "config "+f.Name, fileVals[f.Name]
		}
		if v == "" {
			return
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", src, v, err))
		}
	})
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	c.flags = fs
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.Partitions < 1 || c.Partitions > broker.MaxPartitions:
		return fmt.Errorf("--default-partitions must be 1 to %d", broker.MaxPartitions)
	case c.MaxMoves < 1 || c.MaxMoves > 64:
		return fmt.Errorf("--max-moves must be 1 to 64 (got %d)", c.MaxMoves)
	case c.ClusterVersionMax != 0 && (c.ClusterVersionMax < meta.VersionMin || c.ClusterVersionMax > meta.VersionMax):
		return fmt.Errorf("--cluster-version-max must be 0 (the highest this binary speaks) or %d to %d, the cluster versions this binary speaks", meta.VersionMin, meta.VersionMax)
	case c.Visibility < broker.MinVisibility || c.Visibility > broker.MaxVisibility:
		return fmt.Errorf("--default-visibility-timeout must be %s to %s", broker.ShortDuration(broker.MinVisibility), broker.ShortDuration(broker.MaxVisibility))
	case c.Retention < time.Second:
		return fmt.Errorf("--default-retention must be at least 1s")
	case c.MaxInFlight < 1 || c.MaxAckedAhead < 1:
		return fmt.Errorf("--default-max-in-flight and --default-max-acked-ahead must be at least 1")
	case c.GCPercent != 0 && (c.GCPercent < 25 || c.GCPercent > 10000):
		return fmt.Errorf("--gc-percent must be 0 (the default) or 25 to 10000 (got %d)", c.GCPercent)
	case c.MaxInflightBytes < 0:
		return fmt.Errorf("--max-inflight-bytes must be 0 (no bound) or more")
	case c.StatsInterval < broker.MinStatsInterval || c.StatsInterval > broker.MaxStatsInterval:
		return fmt.Errorf("--stats-interval must be %s to %s", broker.ShortDuration(broker.MinStatsInterval), broker.ShortDuration(broker.MaxStatsInterval))
	case c.SegmentBytes < 4096:
		return fmt.Errorf("--segment-bytes must be at least 4096")
	case c.SnapshotEntries < 16:
		return fmt.Errorf("--replica-snapshot-entries must be at least 16")
	case c.MaxConns < 0:
		return fmt.Errorf("--max-connections must be 0 (no limit) or more")
	case c.MaxConnsPerAddr < 0:
		return fmt.Errorf("--max-connections-per-address must be 0 (no limit) or more")
	case c.ProtectMetrics && c.MetricsPublic:
		return fmt.Errorf("--protect-metrics and --metrics-public contradict each other; /metrics is protected by default, so drop --protect-metrics")
	case c.DebugAddr != "" && !isLoopback(c.DebugAddr) && !c.Insecure:
		return fmt.Errorf("refusing to serve Go's profiles on --debug-addr %s: they have no authentication and reveal memory contents; bind a loopback address (127.0.0.1:6061) or pass --insecure", c.DebugAddr)
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return fmt.Errorf("--tls-cert and --tls-key go together")
	case c.SyncMode != broker.SyncWAL && c.SyncMode != broker.SyncGroup && c.SyncMode != broker.SyncFile:
		return fmt.Errorf("--sync-mode %q: want %s, %s or %s", c.SyncMode, broker.SyncWAL, broker.SyncGroup, broker.SyncFile)
	case c.LogFormat != "text" && c.LogFormat != "json":
		return fmt.Errorf("--log-format %q: want text or json", c.LogFormat)
	case c.RetentionInterval < 0:
		return fmt.Errorf("--retention-interval must be 0 (the default, 10s) or more")
	case c.ShutdownGrace < 0:
		return fmt.Errorf("--shutdown-grace must be 0 or more")
	case c.ReadHeaderTimeout < 0:
		return fmt.Errorf("--read-header-timeout must be 0 or more")
	case c.AuthFailureDelay < 0:
		return fmt.Errorf("--auth-failure-delay must be 0 (none) or more")
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	return c.validateCluster()
}

func newLogger(c config) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	o := &slog.HandlerOptions{Level: lvl}
	// reqid.Handler adds the request id to every line logged with a request's context.
	switch c.LogFormat {
	case "text":
		return slog.New(reqid.NewHandler(slog.NewTextHandler(os.Stderr, o))), nil
	case "json":
		return slog.New(reqid.NewHandler(slog.NewJSONHandler(os.Stderr, o))), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json")
}

// isLoopback reports whether addr (host:port) binds only loopback interfaces. An empty
// host binds every interface, so it is not loopback.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// brokerOptions are the broker's options of this config.
func (c config) brokerOptions(log *slog.Logger) broker.Options {
	return broker.Options{
		DataDir:           c.DataDir,
		NodeID:            c.NodeID,
		Logger:            log,
		SegmentBytes:      c.SegmentBytes,
		SnapshotEntries:   c.SnapshotEntries,
		Syncer:            c.syncer(),
		WAL:               c.SyncMode == broker.SyncWAL,
		RetentionInterval: c.RetentionInterval,
		StatsInterval:     c.StatsInterval,
		MaxLongPolls:      c.MaxLongPolls,
		MaxPeerInflight:   c.MaxPeerInflight,
		Version:           version,
		UpgradeFormat:     c.UpgradeFormat,
		Defaults: broker.TopicDefaults{
			Partitions:    int32(c.Partitions),
			RetentionMs:   c.Retention.Milliseconds(),
			VisibilityMs:  c.Visibility.Milliseconds(),
			MaxInFlight:   int32(c.MaxInFlight),
			MaxAckedAhead: int32(c.MaxAckedAhead),
		},
	}
}

// apiOptions are the HTTP API's options of this config; authOn says whether security
// is on (decided once the broker has read its users).
func (c config) apiOptions(log *slog.Logger, m *broker.Metrics, authOn bool) httpapi.Options {
	inflight := c.MaxInflightBytes
	if inflight == 0 {
		inflight = -1 // no bound (to httpapi, 0 means its default)
	}
	return httpapi.Options{
		Logger:           log,
		Metrics:          m,
		AuthEnabled:      func() bool { return authOn },
		ProtectMetrics:   !c.MetricsPublic,
		AuthFailureDelay: c.AuthFailureDelay,
		AllowedHosts:     strings.Split(c.AllowedHosts, ","),
		MaxInflightBytes: inflight,
	}
}

// listenerOptions are the connection limits of the HTTP port.
func (c config) listenerOptions(log *slog.Logger, m *broker.Metrics) httpapi.ListenerOptions {
	return httpapi.ListenerOptions{
		MaxConns: c.MaxConns, MaxConnsPerAddr: c.MaxConnsPerAddr,
		FirstRequestTimeout: c.ReadHeaderTimeout, Logger: log, Registerer: m.Registry,
	}
}

// syncer is the broker's Syncer for --sync-mode, chosen here so the binary, not the
// broker, decides how writes become durable (validate refused other names).
func (c config) syncer() broker.Syncer {
	s, _ := broker.SyncerFor(c.SyncMode)
	return s
}

// defaultGCPercent is the garbage collector's highest target without --gc-percent or
// GOGC (gctune.go lowers it as the live heap grows).
// Go's own default, 100, made collection 11 % of a node's CPU in the batched flow;
// at 400 the node used 15 % less CPU per message there for about 40 MB more resident
// memory (docs/performance.md, issue 18).
const defaultGCPercent = 400

// walProcessors is the GOMAXPROCS serve sets, or 0 to leave Go's: with the write-ahead
// writer holding its processor through each sync (--wal-hold-processor), one
// processor more than Go's default (cur, the CPUs the node may use), since the held
// one mostly waits for the disk. Without it the request handlers had one processor
// fewer during every sync: the single node's batched flow, bound by their CPU, lost
// up to 10 % (docs/performance.md). Go's GOMAXPROCS, when set, is left alone. (Setting it
// stops Go from following a container's CPU limit as it changes; the limit at start
// counts.)
func walProcessors(c config, gomaxprocs string, cur int) int {
	if c.SyncMode != broker.SyncWAL || !c.WALHoldProcessor || gomaxprocs != "" {
		return 0
	}
	return cur + 1
}

// gcPercent is the target serve gives the collector: --gc-percent when given, else
// Go's GOGC when set (0 here: leave the runtime's), else defaultGCPercent.
func gcPercent(flagValue int, gogc string) int {
	switch {
	case flagValue != 0:
		return flagValue
	case gogc != "":
		return 0
	}
	return defaultGCPercent
}
