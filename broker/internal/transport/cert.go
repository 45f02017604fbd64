package transport

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"time"
)

// alpn names the node-plane protocol in the TLS handshake, so a QUIC client of another
// protocol (HTTP/3, say) fails at TLS instead of reaching the secret handshake.
const alpn = "narad-node/1"

// generateCertificate makes a fresh self-signed ECDSA P-256 certificate valid until
// notAfter. It carries no identity: the cluster-secret handshake authenticates peers,
// TLS only encrypts and supplies the exporter that the proofs are bound to.
func generateCertificate(notAfter time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	notBefore := now.Add(-time.Hour)
	if notAfter.Before(notBefore) {
		notBefore = notAfter.Add(-time.Minute)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "narad node plane"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func serverTLSConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS13,
		NextProtos:   []string{alpn},
		// No client certificate: the client proves itself with the cluster secret.
		ClientAuth: tls.NoClientCert,
		// No resumption, so every connection runs a full handshake with fresh keys and
		// 0-RTT can never be offered.
		SessionTicketsDisabled: true,
	}
}

func clientTLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{alpn},
		ServerName: "narad-node",
		// The certificate is only a carrier for the TLS key exchange: no chain, no name
		// and no date is checked, so a node whose clock jumped or whose certificate
		// expired still connects. The HMAC over the exporter is the authentication.
		InsecureSkipVerify:    true,
		VerifyPeerCertificate: presentedAny,
	}
}

// presentedAny accepts any certificate the server presented, checking neither dates
// nor names on purpose; it only insists that there is one.
func presentedAny(rawCerts [][]byte, _ [][]*x509.Certificate) error {
	if len(rawCerts) == 0 {
		return errors.New("transport: the peer presented no certificate")
	}
	return nil
}

func parseLeaf(c tls.Certificate) (*x509.Certificate, error) {
	if len(c.Certificate) == 0 {
		return nil, errors.New("transport: empty certificate")
	}
	return x509.ParseCertificate(c.Certificate[0])
}
