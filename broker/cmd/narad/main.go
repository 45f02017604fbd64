// Command narad is the Narad broker: one binary, `narad serve` runs a node.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // served only on --debug-addr
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/httpapi"
)

// version is set by the build (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		if err := serve(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "narad:", err)
			os.Exit(1)
		}
	case "version", "--version":
		fmt.Println("narad", version)
	case "help", "-h", "--help":
		usage(os.Stdout)
	default:
		fmt.Fprintf(os.Stderr, "narad: unknown command %q\n", os.Args[1])
		usage(os.Stderr)
		os.Exit(2)
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: narad <command> [flags]

commands:
  serve     run a broker node (narad serve --help lists its flags)
  version   print the version
`)
}

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
	SyncMode          string
	RetentionInterval time.Duration
	ShutdownGrace     time.Duration
	UpgradeFormat     bool

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
	fs.StringVar(&c.SyncMode, "sync-mode", "group", "group: partitions with writes waiting share one file-system sync (syncfs); file: one fdatasync per write")
	fs.DurationVar(&c.RetentionInterval, "retention-interval", 10*time.Second, "how often retention deletes old segments")
	fs.BoolVar(&c.UpgradeFormat, "upgrade-format", false, "allow a data-directory format upgrade that only a backup can undo (upgrades that need it say so and refuse to start without it)")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 25*time.Second, "how long SIGTERM waits for requests in flight")
	fs.IntVar(&c.Partitions, "default-partitions", 3, "partitions of a topic created without a count")
	fs.DurationVar(&c.Retention, "default-retention", 7*24*time.Hour, "retention of a topic created without one")
	fs.DurationVar(&c.Visibility, "default-visibility-timeout", 30*time.Second, "lease length of a topic created without one")
	fs.IntVar(&c.MaxInFlight, "default-max-in-flight", 1024, "in-flight cap per partition of a topic created without one")
	fs.IntVar(&c.MaxAckedAhead, "default-max-acked-ahead", 1024, "acked-ahead cap per partition of a topic created without one")
	return fs.String("config", "", "YAML file of flag names to values (flags and NARAD_* variables override it)")
}

// serverProtocols serves HTTP/1.1, and HTTP/2 both over TLS (negotiated by ALPN) and on
// plain connections from clients that speak it with prior knowledge (h2c): one
// connection then carries many concurrent requests, long polls included.
func serverProtocols() *http.Protocols {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true)
	return &p
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
		fmt.Fprintln(fs.Output(), "usage: narad serve [flags]\n\nEvery flag can also be set as NARAD_<NAME> (e.g. NARAD_HTTP_ADDR) or in the --config file.\n\nflags:")
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
			if fs.Lookup(k) == nil || k == "config" {
				return c, fmt.Errorf("config %s: unknown setting %q", *cfgFile, k)
			}
			fileVals[k] = fmt.Sprint(v)
		}
	}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || f.Name == "config" {
			return
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
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.Partitions < 1 || c.Partitions > broker.MaxPartitions:
		return fmt.Errorf("--default-partitions must be 1 to %d", broker.MaxPartitions)
	case c.Visibility < broker.MinVisibility || c.Visibility > broker.MaxVisibility:
		return fmt.Errorf("--default-visibility-timeout must be 100ms to 12h")
	case c.Retention < time.Second:
		return fmt.Errorf("--default-retention must be at least 1s")
	case c.MaxInFlight < 1 || c.MaxAckedAhead < 1:
		return fmt.Errorf("--default-max-in-flight and --default-max-acked-ahead must be at least 1")
	case c.MaxInflightBytes < 0:
		return fmt.Errorf("--max-inflight-bytes must be 0 (no bound) or more")
	case c.SegmentBytes < 4096:
		return fmt.Errorf("--segment-bytes must be at least 4096")
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
	}
	return nil
}

func newLogger(c config) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	o := &slog.HandlerOptions{Level: lvl}
	switch c.LogFormat {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, o)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json")
}

func serve(args []string) error {
	c, err := loadConfig(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	slog.SetDefault(log)

	b, err := broker.Open(broker.Options{
		DataDir:           c.DataDir,
		NodeID:            c.NodeID,
		Logger:            log,
		SegmentBytes:      c.SegmentBytes,
		SyncMode:          c.SyncMode,
		RetentionInterval: c.RetentionInterval,
		MaxLongPolls:      c.MaxLongPolls,
		Version:           version,
		UpgradeFormat:     c.UpgradeFormat,
		Defaults: broker.TopicDefaults{
			Partitions:    int32(c.Partitions),
			RetentionMs:   c.Retention.Milliseconds(),
			VisibilityMs:  c.Visibility.Milliseconds(),
			MaxInFlight:   int32(c.MaxInFlight),
			MaxAckedAhead: int32(c.MaxAckedAhead),
		},
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = b.Start(startCtx)
	cancel()
	if err != nil {
		b.Close()
		return fmt.Errorf("recovering: %w", err)
	}
	if c.AdminPassword != "" {
		created, err := b.SeedAdmin(c.AdminPassword)
		if err != nil {
			b.Close()
			return fmt.Errorf("seeding the admin user: %w", err)
		}
		if created {
			log.Info("created the admin user from --admin-password")
		}
	}
	users, _ := b.Users()
	authOn := c.AdminPassword != "" || len(users) > 0
	if !authOn && !c.Insecure && !isLoopback(c.HTTPAddr) {
		b.Close()
		return fmt.Errorf("refusing to serve %s without authentication: set NARAD_ADMIN_PASSWORD (or --admin-password), bind a loopback address, or pass --insecure", c.HTTPAddr)
	}

	inflight := c.MaxInflightBytes
	if inflight == 0 {
		inflight = -1 // no bound (to httpapi, 0 means its default)
	}
	api, err := httpapi.New(b, httpapi.Options{Logger: log, Metrics: b.Metrics(), AuthEnabled: func() bool { return authOn }, ProtectMetrics: !c.MetricsPublic, AuthFailureDelay: c.AuthFailureDelay,
		AllowedHosts: strings.Split(c.AllowedHosts, ","), MaxInflightBytes: inflight})
	if err != nil {
		b.Close()
		return err
	}
	rawLn, err := net.Listen("tcp", c.HTTPAddr)
	if err != nil {
		b.Close()
		return err
	}
	conns, err := httpapi.NewListener(rawLn, httpapi.ListenerOptions{
		MaxConns: c.MaxConns, MaxConnsPerAddr: c.MaxConnsPerAddr,
		FirstRequestTimeout: c.ReadHeaderTimeout, Logger: log, Registerer: b.Metrics().Registry,
	})
	if err != nil {
		rawLn.Close()
		b.Close()
		return err
	}
	var ln net.Listener = conns
	srv := &http.Server{
		Handler:           conns.Handler(api),
		ConnContext:       conns.ConnContext,
		ReadHeaderTimeout: c.ReadHeaderTimeout,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      broker.MaxWait + 40*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		Protocols:         serverProtocols(),
	}
	scheme := "http"
	if c.TLSCert != "" {
		certs, err := newCertReloader(c.TLSCert, c.TLSKey, log)
		if err != nil {
			ln.Close()
			b.Close()
			return err
		}
		srv.TLSConfig = certs.tlsConfig()
		ln = tls.NewListener(ln, srv.TLSConfig)
		scheme = "https"
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go func() {
			tick := time.NewTicker(5 * time.Second)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-hup:
					certs.reloadIfChanged(true)
				case <-tick.C:
					certs.reloadIfChanged(false)
				}
			}
		}()
	}
	if c.DebugAddr != "" {
		dbg := &http.Server{Addr: c.DebugAddr, Handler: http.DefaultServeMux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := dbg.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("debug listener failed", "addr", c.DebugAddr, "err", err)
			}
		}()
		defer dbg.Close()
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	if c.ProtectMetrics {
		log.Warn("--protect-metrics is deprecated and has no effect: with security on, /metrics needs an admin's credentials unless --metrics-public")
	}
	if authOn && c.MetricsPublic {
		log.Warn("/metrics is served without credentials (--metrics-public): its labels name every topic")
	}
	if authOn {
		log.Info("narad ready", "version", version, "url", scheme+"://"+ln.Addr().String(), "data_dir", c.DataDir, "node_id", b.NodeID(), "security", "on")
	} else {
		log.Warn("SECURITY IS OFF: no authentication, anyone who reaches this port can read and write every topic; set NARAD_ADMIN_PASSWORD to turn it on",
			"url", scheme+"://"+ln.Addr().String())
		log.Info("narad ready", "version", version, "url", scheme+"://"+ln.Addr().String(), "data_dir", c.DataDir, "node_id", b.NodeID(), "security", "off")
	}

	select {
	case err := <-serveErr:
		b.Close()
		return err
	case <-ctx.Done():
	}
	log.Info("narad stopping: draining requests", "grace", c.ShutdownGrace)
	b.Drain()
	sctx, scancel := context.WithTimeout(context.Background(), c.ShutdownGrace)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("requests still running at the end of the grace period were cut", "err", err)
	}
	if err := b.Close(); err != nil {
		return fmt.Errorf("closing: %w", err)
	}
	log.Info("narad stopped")
	return nil
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
