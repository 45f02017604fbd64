package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// certReloader serves the HTTP port's certificate and reloads it from disk on SIGHUP and
// whenever the files' contents change, so a renewed certificate takes effect without a
// restart. It compares contents (a SHA-256 of both files), not modification times: a
// rotation by cp -p, rsync -t or a restore from backup can leave the new files with
// times no newer than the old ones. A reload that fails keeps the previous certificate
// and logs why.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu   sync.RWMutex
	cert *tls.Certificate
	sum  [sha256.Size]byte // of the files the certificate was loaded from
}

func newCertReloader(certFile, keyFile string, log *slog.Logger) (*certReloader, error) {
	c := &certReloader{certFile: certFile, keyFile: keyFile, log: log}
	certPEM, keyPEM, sum, err := c.read()
	if err != nil {
		return nil, err
	}
	if err := c.load(certPEM, keyPEM, sum); err != nil {
		return nil, err
	}
	return c, nil
}

// read returns both files and a digest of the pair.
func (c *certReloader) read() (certPEM, keyPEM []byte, sum [sha256.Size]byte, err error) {
	if certPEM, err = os.ReadFile(c.certFile); err != nil {
		return nil, nil, sum, fmt.Errorf("tls: %w", err)
	}
	if keyPEM, err = os.ReadFile(c.keyFile); err != nil {
		return nil, nil, sum, fmt.Errorf("tls: %w", err)
	}
	h := sha256.New()
	h.Write(certPEM)
	h.Write([]byte{0}) // PEM never holds a NUL: the pair's boundary is unambiguous
	h.Write(keyPEM)
	h.Sum(sum[:0])
	return certPEM, keyPEM, sum, nil
}

func (c *certReloader) load(certPEM, keyPEM []byte, sum [sha256.Size]byte) error {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("tls: loading %s and %s: %w", c.certFile, c.keyFile, err)
	}
	c.mu.Lock()
	c.cert, c.sum = &cert, sum
	c.mu.Unlock()
	return nil
}

// reloadIfChanged reloads when the files' contents differ from the loaded certificate's
// (force: always, as on SIGHUP).
func (c *certReloader) reloadIfChanged(force bool) {
	certPEM, keyPEM, sum, err := c.read()
	if err != nil {
		c.log.Error("reloading the TLS certificate failed; keeping the previous one", "err", err)
		return
	}
	c.mu.RLock()
	same := bytes.Equal(sum[:], c.sum[:])
	c.mu.RUnlock()
	if same && !force {
		return
	}
	if err := c.load(certPEM, keyPEM, sum); err != nil {
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

// tls12Suites are the TLS 1.2 cipher suites offered: forward-secret AEAD only. Go's
// defaults still include CBC suites with SHA-1 MACs (Lucky13-style padding oracles);
// every client of the last decade speaks one of these. TLS 1.3's suites are not
// configurable and are all AEAD.
var tls12Suites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

func (c *certReloader) tlsConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, CipherSuites: tls12Suites, GetCertificate: c.getCertificate}
}
