package tlscert

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pair writes a new self-signed pair into dir and returns the files and the certificate.
func pair(t *testing.T, dir string, mod time.Time) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	cp, kp, err := SelfSigned("127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for f, b := range map[string][]byte{certFile: cp, keyFile: kp} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	kp2, err := tls.X509KeyPair(cp, kp)
	if err != nil {
		t.Fatal(err)
	}
	cert, err = x509.ParseCertificate(kp2.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

// served is the certificate a TLS client meets on a handshake with c.
func served(t *testing.T, c *Cert) *x509.Certificate {
	t.Helper()
	got, err := c.Config().GetCertificate(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(got.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

func TestReload(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	cf, kf, first := pair(t, dir, now)
	c, err := Load(cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	if served(t, c).SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Fatal("not the loaded certificate")
	}
	if changed, err := c.Reload(); changed || err != nil {
		t.Fatalf("Reload of unchanged files: %v %v", changed, err)
	}
	// A renewal: the new pair is served from the next handshake on.
	_, _, second := pair(t, dir, now.Add(2*time.Second))
	if changed, err := c.Reload(); !changed || err != nil {
		t.Fatalf("Reload of a renewed pair: %v %v", changed, err)
	}
	if served(t, c).SerialNumber.Cmp(second.SerialNumber) != 0 {
		t.Fatal("the renewed certificate is not served")
	}
	// Half a renewal (a key that is not the certificate's) keeps the pair in force.
	cp, _, err := SelfSigned("localhost")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cf, cp, 0o600); err != nil {
		t.Fatal(err)
	}
	later := now.Add(4 * time.Second)
	if err := os.Chtimes(cf, later, later); err != nil {
		t.Fatal(err)
	}
	if changed, err := c.Reload(); changed || err == nil {
		t.Fatalf("Reload of a mismatched pair: %v %v", changed, err)
	}
	if served(t, c).SerialNumber.Cmp(second.SerialNumber) != 0 {
		t.Fatal("a mismatched pair replaced the certificate in force")
	}
	if _, err := Load(filepath.Join(dir, "none"), kf); err == nil {
		t.Fatal("Load of a missing certificate succeeded")
	}
}
