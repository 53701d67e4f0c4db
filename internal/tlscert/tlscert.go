// Package tlscert serves a TLS certificate from a certificate and a key file, reloaded when
// either file changes, so that a renewed certificate (cert-manager's, say) takes effect
// without a restart and without dropping connections: a handshake uses the certificate in
// force when it starts.
//
// Cert is safe for concurrent use: handshakes read the certificate lock-free while Reload
// swaps it.
package tlscert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Cert is the certificate of a certificate file and a key file. Safe for concurrent use.
type Cert struct {
	certFile, keyFile string
	cert              atomic.Pointer[tls.Certificate]

	mu   sync.Mutex // serializes Reload
	stat [2]fileStat
}

type fileStat struct {
	mod  time.Time
	size int64
}

// Load reads the pair of PEM files; a pair that does not load is an error.
func Load(certFile, keyFile string) (*Cert, error) {
	c := &Cert{certFile: certFile, keyFile: keyFile}
	if _, err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload loads the pair again if either file's size or modification time changed, and reports
// whether the certificate changed. A pair that does not load (a renewal half written: the new
// certificate beside the old key) leaves the certificate in force; the next Reload tries again.
func (c *Cert) Reload() (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var st [2]fileStat
	for i, f := range [2]string{c.certFile, c.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return false, fmt.Errorf("tlscert: %w", err)
		}
		st[i] = fileStat{fi.ModTime(), fi.Size()}
	}
	if c.cert.Load() != nil && st == c.stat {
		return false, nil
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return false, fmt.Errorf("tlscert: %w", err)
	}
	c.cert.Store(&cert)
	c.stat = st
	return true, nil
}

// Config returns a server TLS configuration serving the certificate in force (TLS 1.2 at
// least, HTTP/1.1 offered by ALPN).
func (c *Cert) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.cert.Load(), nil
		},
	}
}

// Leaf is the certificate in force, parsed (for logs and tests).
func (c *Cert) Leaf() *tls.Certificate { return c.cert.Load() }

// SelfSigned returns a new self-signed certificate and its key, both PEM, valid for an hour
// for the given DNS names and IP addresses: for tests and trials on loopback, never for
// production.
func SelfSigned(hosts ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "kvrouterd test"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}
