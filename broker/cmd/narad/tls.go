package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// certReloader serves the HTTP port's certificate and reloads it from disk on SIGHUP and
// whenever the files change, so a renewed certificate takes effect without a restart. A
// reload that fails keeps the previous certificate and logs why.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.RWMutex
	cert    *tls.Certificate
	modTime time.Time
}

func newCertReloader(certFile, keyFile string, log *slog.Logger) (*certReloader, error) {
	c := &certReloader{certFile: certFile, keyFile: keyFile, log: log}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *certReloader) newest() (time.Time, error) {
	var t time.Time
	for _, f := range []string{c.certFile, c.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return t, err
		}
		if fi.ModTime().After(t) {
			t = fi.ModTime()
		}
	}
	return t, nil
}

func (c *certReloader) reload() error {
	mt, err := c.newest()
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("tls: loading %s and %s: %w", c.certFile, c.keyFile, err)
	}
	c.mu.Lock()
	c.cert, c.modTime = &cert, mt
	c.mu.Unlock()
	return nil
}

// reloadIfChanged reloads when the files are newer than the loaded certificate (force:
// always, as on SIGHUP).
func (c *certReloader) reloadIfChanged(force bool) {
	mt, err := c.newest()
	c.mu.RLock()
	same := err == nil && !mt.After(c.modTime)
	c.mu.RUnlock()
	if same && !force {
		return
	}
	if err := c.reload(); err != nil {
		c.log.Error("reloading the TLS certificate failed; keeping the previous one", "err", err)
		return
	}
	c.log.Info("TLS certificate reloaded", "cert", c.certFile)
}

func (c *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cert, nil
}

func (c *certReloader) tlsConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.getCertificate}
}
