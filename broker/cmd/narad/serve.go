package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // served only on --debug-addr
	"os"
	"os/signal"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/cluster"
	"github.com/narad-mq/narad/broker/internal/console"
	"github.com/narad-mq/narad/broker/internal/httpapi"
	"github.com/narad-mq/narad/broker/internal/storage/format"
)

// serve runs a node until SIGTERM or SIGINT, then drains it. It is the one wiring
// point: the broker is opened here and closed by one deferred call, whichever way serve
// returns.
func serve(args []string) (err error) {
	c, err := loadConfig(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if c.PrintConfig {
		return printConfig(os.Stdout, c)
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	slog.SetDefault(log)
	if p := gcPercent(c.GCPercent, os.Getenv("GOGC")); p != 0 {
		tuner := newGCTuner(p)
		tuner.apply()
		stopTune := make(chan struct{})
		defer close(stopTune)
		go tuner.run(stopTune)
	}
	if n := walProcessors(c, os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0)); n > 0 {
		runtime.GOMAXPROCS(n)
		log.Debug("one Go processor more than the CPUs: the write-ahead writer keeps one through its syncs", "gomaxprocs", n)
	}

	// The data directory's lock before anything else: a node started twice on one
	// directory is told so, and starts no node plane on the way (broker.Open owns the
	// lock from the moment it is called).
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return err
	}
	unlock, err := format.Lock(c.DataDir)
	if err != nil {
		return err
	}
	handed := false
	defer func() {
		if !handed {
			unlock()
		}
	}()
	bopts := c.brokerOptions(log)
	bopts.Unlock = unlock
	var plane *cluster.Plane
	if c.ClusterAddr != "" {
		if plane, bopts.NodeID, err = startPlane(c, log); err != nil {
			return err
		}
		// Deferred first, so it runs last: after the broker (and its Raft) closed.
		defer func() { _ = plane.Close() }() // closing the node plane at exit has nothing left to tell
		if bopts.Cluster, err = c.metaCluster(plane); err != nil {
			return err
		}
		bopts.Peers = plane
		bopts.Node = plane.Node()
		// Remote children's passwords are sealed under the cluster secret, read again
		// at each use so a rotation (SIGHUP) applies.
		bopts.SecretKeys = c.clusterSecrets
	} else if c.AdvertiseAddr != "" || !isWildcard(c.HTTPAddr) {
		// A lone node shows its HTTP URL in its member record too (validated).
		bopts.Cluster.HTTPAddr, _ = c.httpAdvertise()
	}
	bopts.Cluster.VersionMax = c.ClusterVersionMax
	bopts.Cluster.AutoRebalance, bopts.Cluster.MaxMoves = c.AutoRebalance, c.MaxMoves
	bopts.NoLeaderLease = !c.LeaderLeases
	bopts.WALNoHold = !c.WALHoldProcessor
	handed = true
	b, err := broker.Open(bopts)
	if err != nil {
		return err
	}
	if plane != nil {
		plane.Serve(b.HandleForward)
		plane.ServeData(b.HandleData, b.CheckPeer)
		if err := plane.Register(b.Metrics().Registry); err != nil {
			_ = b.Close() // the registration failure is the error to report
			return err
		}
	}
	if err := cluster.RegisterControlPlane(b.Metrics().Registry, b.RaftState); err != nil {
		_ = b.Close() // the registration failure is the error to report
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var hup chan os.Signal // SIGHUP reloads the TLS certificate and the cluster secrets
	stopped := false
	// Until the broker starts to close: a failure while it closes ends serve with an
	// error (below) instead of cutting the close short.
	served := make(chan struct{})
	go failStop(b.StorageFailed(), served, log, os.Exit)
	defer func() {
		close(served)
		cerr := b.Close()
		select {
		case ferr := <-b.StorageFailed():
			if cerr == nil {
				cerr = fmt.Errorf("the write-ahead file failed; the next start replays it: %w", ferr)
			}
		default:
		}
		if hup != nil {
			// Only now: a SIGHUP while the broker closes must not kill the process.
			signal.Stop(hup)
		}
		switch {
		case err != nil: // the failure that ended serve is the one to report
		case cerr != nil:
			err = fmt.Errorf("closing: %w", cerr)
		case stopped:
			log.Info("narad stopped")
		}
	}()

	// The HTTP port opens before the node is ready: until then it answers /healthz, and
	// 503 with Retry-After everywhere else (/readyz included), so a probe sees "not yet"
	// rather than a refused connection while a cluster node waits for its peers. The API
	// takes over once the node is ready.
	var handler atomic.Pointer[http.Handler]
	starting := httpapi.Starting()
	handler.Store(&starting)
	rawLn, err := net.Listen("tcp", c.HTTPAddr)
	if err != nil {
		return err
	}
	conns, err := httpapi.NewListener(rawLn, c.listenerOptions(log, b.Metrics()))
	if err != nil {
		_ = rawLn.Close() // the error from NewListener is the one to report
		return err
	}
	var ln net.Listener = conns
	srv := &http.Server{
		Handler:           conns.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*handler.Load()).ServeHTTP(w, r) })),
		ConnContext:       conns.ConnContext,
		ReadHeaderTimeout: c.ReadHeaderTimeout,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      broker.MaxWait + 40*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    httpapi.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		Protocols:         serverProtocols(),
	}
	scheme := "http"
	var certs *certReloader
	if c.TLSCert != "" {
		certs, err = newCertReloader(c.TLSCert, c.TLSKey, log)
		if err != nil {
			_ = ln.Close() // the certificate error is the one to report
			return err
		}
		srv.TLSConfig = certs.tlsConfig()
		ln = tls.NewListener(ln, srv.TLSConfig)
		scheme = "https"
	}
	if certs != nil || plane != nil {
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		go watchHUP(ctx, certs, secretReloader(c, plane, log), hup)
	}
	if c.DebugAddr != "" {
		dbg := &http.Server{Addr: c.DebugAddr, Handler: http.DefaultServeMux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := dbg.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("debug listener failed", "addr", c.DebugAddr, "err", err)
			}
		}()
		defer func() { _ = dbg.Close() }() // the debug listener holds no data; shutdown goes on
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	// Closes the port on every way out; after a graceful Shutdown it does nothing.
	defer func() { _ = srv.Close() }()
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	if plane != nil {
		// A cluster node waits for its peers (or to be added) for as long as it takes.
		cancel()
		startCtx, cancel = context.WithCancel(ctx)
		log.Info("waiting for the cluster's control plane", "node_id", b.NodeID(), "cluster_addr", plane.Addr())
	}
	// SIGTERM before the node was ready (a cluster node still waiting for its peers
	// or for the control plane): a requested stop, not a failure.
	stoppedEarly := func(err error) bool {
		if err == nil || ctx.Err() == nil {
			return false
		}
		log.Info("narad stopped before it was ready", "reason", err)
		stopped = true
		return true
	}
	err = b.Start(startCtx)
	cancel()
	if stoppedEarly(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("recovering: %w", err)
	}
	authOn, err := securityOn(ctx, c, brokerUsers{b}, log)
	if stoppedEarly(err) {
		return nil
	}
	if err != nil {
		return err
	}
	api, err := httpapi.New(b, c.apiOptions(log, b.Metrics(), authOn))
	if err != nil {
		return err
	}
	if c.Console {
		api = console.Handler(api)
	}
	handler.Store(&api)
	logReady(c, log, b, authOn, scheme+"://"+ln.Addr().String())

	select {
	case err := <-serveErr:
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
	stopped = true
	return nil
}

// exitStorageFailed is the exit status of a node that stopped because its write-ahead
// file failed (EX_IOERR of sysexits.h).
const exitStorageFailed = 74

// failStop ends the process at once when the node's write-ahead file fails: no
// partition of the node can store a write any more, and the kernel may have dropped
// pages a failed sync was asked to write, so the only state to trust is what is on
// disk. Exiting as after a crash (no graceful close, which would write and sync more)
// lets the cluster move this node's leaderships at once, and the restart a service
// manager makes replays the write-ahead file from the disk.
func failStop(failed <-chan error, served <-chan struct{}, log *slog.Logger, exit func(int)) {
	var err error
	select {
	case err = <-failed:
	case <-served:
		return
	}
	log.Error("stopping at once: the write-ahead file failed, so this node can store nothing more; a restart replays what is on disk (exit status 74)", "err", err)
	exit(exitStorageFailed)
}

// userStore is what securityOn needs of the broker.
type userStore interface {
	SeedAdmin(password string) (created bool, err error)
	HasUsers() (bool, error)
}

type brokerUsers struct{ *broker.Broker }

func (b brokerUsers) HasUsers() (bool, error) {
	users, err := b.Users()
	return len(users) > 0, err
}

// securityOn seeds the admin user from --admin-password and reports whether security
// is on: it is once any user exists. A node without it refuses to serve a non-loopback
// address unless --insecure. While the control plane cannot answer (a cluster node
// whose metadata lease lapsed between its start and this read, as when the leader of
// the control plane moves during a rolling restart) it tries again until ctx ends,
// rather than exit a node its operator just restarted.
func securityOn(ctx context.Context, c config, b userStore, log *slog.Logger) (bool, error) {
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval, retry.MaxInterval, retry.MaxElapsedTime = 50*time.Millisecond, 2*time.Second, 0
	for {
		authOn, err := readSecurity(c, b, log)
		if err == nil || !(errors.Is(err, broker.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)) {
			return authOn, err
		}
		wait := retry.NextBackOff()
		log.Warn("the control plane could not answer the users yet; trying again", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("%w (stopped while waiting for the control plane)", err)
		case <-time.After(wait):
		}
	}
}

func readSecurity(c config, b userStore, log *slog.Logger) (bool, error) {
	if c.AdminPassword != "" {
		created, err := b.SeedAdmin(c.AdminPassword)
		if err != nil {
			return false, fmt.Errorf("seeding the admin user: %w", err)
		}
		if created {
			log.Info("created the admin user from --admin-password")
		}
	}
	// Security is on once any user exists: a failure to read them must stop the node,
	// not be taken for "no users", which would serve every topic without credentials.
	exist, err := b.HasUsers()
	if err != nil {
		return false, fmt.Errorf("reading the users: %w", err)
	}
	authOn := c.AdminPassword != "" || exist
	if !authOn && !c.Insecure && !isLoopback(c.HTTPAddr) {
		return false, fmt.Errorf("refusing to serve %s without authentication: set NARAD_ADMIN_PASSWORD (or --admin-password), bind a loopback address, or pass --insecure", c.HTTPAddr)
	}
	return authOn, nil
}

// watchHUP reloads the TLS certificate (when there is one) on SIGHUP and when its
// files' contents change (checked every 5 s), and the cluster secrets (when reload is
// not nil) on SIGHUP, until ctx ends.
func watchHUP(ctx context.Context, certs *certReloader, reload func(), hup <-chan os.Signal) {
	var tick <-chan time.Time
	if certs != nil {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if certs != nil {
				certs.reloadIfChanged(true)
			}
			if reload != nil {
				reload()
			}
		case <-tick:
			certs.reloadIfChanged(false)
		}
	}
}

// logReady says the node serves, and warns of what the operator chose to leave open.
func logReady(c config, log *slog.Logger, b *broker.Broker, authOn bool, url string) {
	if c.ProtectMetrics {
		log.Warn("--protect-metrics is deprecated and has no effect: with security on, /metrics needs an admin's credentials unless --metrics-public")
	}
	if authOn && c.MetricsPublic {
		log.Warn("/metrics is served without credentials (--metrics-public): its labels name every topic")
	}
	if authOn {
		log.Info("narad ready", "version", version, "url", url, "data_dir", c.DataDir, "node_id", b.NodeID(), "security", "on")
		return
	}
	log.Warn("SECURITY IS OFF: no authentication, anyone who reaches this port can read and write every topic; set NARAD_ADMIN_PASSWORD to turn it on",
		"url", url)
	log.Info("narad ready", "version", version, "url", url, "data_dir", c.DataDir, "node_id", b.NodeID(), "security", "off")
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
