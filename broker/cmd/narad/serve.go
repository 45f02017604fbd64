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
	"syscall"
	"time"

	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/httpapi"
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
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	slog.SetDefault(log)

	b, err := broker.Open(c.brokerOptions(log))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var hup chan os.Signal // SIGHUP reloads the TLS certificate; set with it
	stopped := false
	defer func() {
		cerr := b.Close()
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

	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = b.Start(startCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("recovering: %w", err)
	}
	authOn, err := securityOn(c, b, log)
	if err != nil {
		return err
	}
	api, err := httpapi.New(b, c.apiOptions(log, b.Metrics(), authOn))
	if err != nil {
		return err
	}
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
		Handler:           conns.Handler(api),
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
	if c.TLSCert != "" {
		certs, err := newCertReloader(c.TLSCert, c.TLSKey, log)
		if err != nil {
			_ = ln.Close() // the certificate error is the one to report
			return err
		}
		srv.TLSConfig = certs.tlsConfig()
		ln = tls.NewListener(ln, srv.TLSConfig)
		scheme = "https"
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		go watchCert(ctx, certs, hup)
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

// securityOn seeds the admin user from --admin-password and reports whether security
// is on: it is once any user exists. A node without it refuses to serve a non-loopback
// address unless --insecure.
func securityOn(c config, b *broker.Broker, log *slog.Logger) (bool, error) {
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
	users, err := b.Users()
	if err != nil {
		return false, fmt.Errorf("reading the users: %w", err)
	}
	authOn := c.AdminPassword != "" || len(users) > 0
	if !authOn && !c.Insecure && !isLoopback(c.HTTPAddr) {
		return false, fmt.Errorf("refusing to serve %s without authentication: set NARAD_ADMIN_PASSWORD (or --admin-password), bind a loopback address, or pass --insecure", c.HTTPAddr)
	}
	return authOn, nil
}

// watchCert reloads the TLS certificate on SIGHUP, and when its files' contents change
// (checked every 5 s), until ctx ends.
func watchCert(ctx context.Context, certs *certReloader, hup <-chan os.Signal) {
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
