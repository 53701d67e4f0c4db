package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/internal/natstest"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// TestDaemonNATSNKey runs the binary against a nats-server process whose only user is an NKey:
// without --nats-nkey, or with another key's seed, the server refuses the daemon, which exits
// saying so; with the user's seed it reads the stream that a publisher with the same key fills.
func TestDaemonNATSNKey(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs nats-server")
	}
	n := natstest.NewNode(t, natstest.Binary(t), "nkey", false)
	dir := t.TempDir()
	seed := func(name string) (file, public string) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		s, err := kp.Seed()
		if err != nil {
			t.Fatal(err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		file = filepath.Join(dir, name)
		if err := os.WriteFile(file, append(s, '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
		return file, pub
	}
	user, pub := seed("user.nk")
	other, _ := seed("other.nk")
	n.Extra = fmt.Sprintf("authorization {\n  users = [ { nkey: %q } ]\n}\n", pub)
	n.Start()

	bin := buildDaemon(t)
	refused(t, bin, n, "Authorization Violation", "--nats-url", n.URL(), "--data-dir", t.TempDir())
	refused(t, bin, n, "Authorization Violation", "--nats-url", n.URL(), "--nats-nkey", other, "--data-dir", t.TempDir())
	d := startDaemon(t, bin, "--nats-url", n.URL(), "--nats-nkey", user, "--data-dir", t.TempDir())
	t.Cleanup(func() { d.cmd.Process.Kill(); d.cmd.Wait() })
	opt, err := nats.NkeyOptionFromSeed(user)
	if err != nil {
		t.Fatal(err)
	}
	eventsFlow(t, d, n.URL(), opt)
}

// TestDaemonNATSCreds runs the binary against a nats-server process in operator mode (JWTs:
// an operator, its system account and one account with JetStream, preloaded in a memory
// resolver) whose users authenticate with a creds file, the user's JWT and NKey seed: with
// the creds of a user of an account the server does not know, the server refuses the daemon,
// which exits saying so; a file that is no creds file fails the start, naming the flag; with a
// user of the account's it reads the stream that a publisher with its own creds fills.
func TestDaemonNATSCreds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs nats-server")
	}
	n := natstest.NewNode(t, natstest.Binary(t), "creds", false)
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	key := func(create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, string) {
		t.Helper()
		kp, err := create()
		must(err)
		pub, err := kp.PublicKey()
		must(err)
		return kp, pub
	}
	operator, operatorPub := key(nkeys.CreateOperator)
	operatorJWT, err := jwt.NewOperatorClaims(operatorPub).Encode(operator)
	must(err)
	// account is a JWT the operator signed; with JetStream, unlimited, for the stream.
	account := func(name string, jetStream bool) (kp nkeys.KeyPair, pub, token string) {
		t.Helper()
		kp, pub = key(nkeys.CreateAccount)
		ac := jwt.NewAccountClaims(pub)
		ac.Name = name
		if jetStream {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		token, err := ac.Encode(operator)
		must(err)
		return kp, pub, token
	}
	// creds writes the creds file of a new user of the account signer.
	creds := func(file string, signer nkeys.KeyPair) string {
		t.Helper()
		user, userPub := key(nkeys.CreateUser)
		uc := jwt.NewUserClaims(userPub)
		uc.Name = file
		token, err := uc.Encode(signer)
		must(err)
		seed, err := user.Seed()
		must(err)
		b, err := jwt.FormatUserConfig(token, seed)
		must(err)
		path := filepath.Join(dir, file)
		must(os.WriteFile(path, b, 0o600))
		return path
	}
	_, sysPub, sysJWT := account("SYS", false)
	kvr, kvrPub, kvrJWT := account("KVR", true)
	stranger, _, _ := account("STRANGER", true) // signed by the operator, unknown to the server
	n.Extra = fmt.Sprintf("operator: %s\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n  %s: %s\n  %s: %s\n}\n",
		operatorJWT, sysPub, sysPub, sysJWT, kvrPub, kvrJWT)
	n.Start()
	daemonCreds, publisherCreds := creds("kvrouterd.creds", kvr), creds("publisher.creds", kvr)
	strangerCreds := creds("stranger.creds", stranger)
	notCreds := filepath.Join(dir, "not.creds")
	must(os.WriteFile(notCreds, []byte("user: kvrouterd\npassword: secret\n"), 0o600))

	bin := buildDaemon(t)
	refused(t, bin, n, "Authorization Violation", "--nats-url", n.URL(), "--nats-creds", strangerCreds, "--data-dir", t.TempDir())
	bad := launchDaemon(t, bin, "--nats-url", n.URL(), "--nats-creds", notCreds, "--data-dir", t.TempDir())
	if err := bad.cmd.Wait(); bad.cmd.ProcessState.ExitCode() != 2 || !strings.Contains(bad.log(), "kvrouterd: --nats-creds "+notCreds+": no user JWT") {
		t.Fatalf("a file that is no creds file: exit %v, want status 2 and a line naming --nats-creds and saying it holds no user JWT:\n%s", err, bad.log())
	}
	d := startDaemon(t, bin, "--nats-url", n.URL(), "--nats-creds", daemonCreds, "--data-dir", t.TempDir())
	t.Cleanup(func() { d.cmd.Process.Kill(); d.cmd.Wait() })
	eventsFlow(t, d, n.URL(), nats.UserCredentials(publisherCreds))
}

// TestDaemonNATSTLS runs the binary against a nats-server process that takes TLS clients only,
// each with a certificate of the test's CA (verify): without --nats-tls-ca the daemon does not
// trust the server, without a client certificate the server refuses it; with both it reads
// the stream that a publisher with its own certificate fills.
func TestDaemonNATSTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs nats-server")
	}
	n := natstest.NewNode(t, natstest.Binary(t), "tls", false)
	pki := newTestPKI(t)
	n.Extra = fmt.Sprintf("tls {\n  cert_file: %q\n  key_file: %q\n  ca_file: %q\n  verify: true\n}\n", pki.serverCert, pki.serverKey, pki.ca)
	n.Start()

	bin := buildDaemon(t)
	client := []string{"--nats-tls-cert", pki.clientCert, "--nats-tls-key", pki.clientKey}
	refused(t, bin, n, "certificate signed by unknown authority", append([]string{"--nats-url", n.URL(), "--data-dir", t.TempDir()}, client...)...)
	refused(t, bin, n, "tls", "--nats-url", n.URL(), "--nats-tls-ca", pki.ca, "--data-dir", t.TempDir())
	d := startDaemon(t, bin, append([]string{"--nats-url", n.URL(), "--nats-tls-ca", pki.ca, "--data-dir", t.TempDir()}, client...)...)
	t.Cleanup(func() { d.cmd.Process.Kill(); d.cmd.Wait() })
	eventsFlow(t, d, n.URL(), nats.RootCAs(pki.ca), nats.ClientCert(pki.clientCert, pki.clientKey))
}

// refused runs the binary with args, which name a NATS server n does not let it use, and
// checks that it exits with status 1 and one line naming --nats-url and saying why.
func refused(t *testing.T, bin string, n *natstest.Node, why string, args ...string) {
	t.Helper()
	d := launchDaemon(t, bin, args...)
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		if l := d.log(); d.cmd.ProcessState.ExitCode() != 1 || !strings.Contains(l, "kvrouterd: --nats-url "+n.URL()) || !strings.Contains(l, why) {
			t.Fatalf("%v: exit %v, want status 1 and a line naming --nats-url and %q:\n%s", args, err, why, l)
		}
	case <-time.After(time.Minute): // a hung start, not a timing
		d.cmd.Process.Kill()
		t.Fatalf("%v: the daemon neither started nor exited:\n%s\n%s", args, d.log(), n.Log())
	}
}

// eventsFlow publishes a batch to the server at url as a publisher connecting with opts, and
// waits until daemon d's index has it.
func eventsFlow(t *testing.T, d *proc, url string, opts ...nats.Option) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub, err := ingest.NewPublisher(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	toks := []uint32{1, 2, 3, 4}
	b := &wire.EventBatch{Worker: 1, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Stored, ID: 1, BlockSize: 4, Hashes: []uint64{7}, Tokens: toks}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pub.Batch(ctx, b); err != nil {
		t.Fatal(err)
	}
	c := client.New(client.Config{Addr: d.addr, Timeout: 5 * time.Second})
	for cachedOn(c, toks, 1) != 1 {
		if ctx.Err() != nil {
			t.Fatalf("the batch never reached the index:\n%s", d.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testPKI is a CA and two certificates it signed, as PEM files: the server's, for 127.0.0.1,
// and a client's.
type testPKI struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvrouterd test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	var p testPKI
	p.ca = write("ca.pem", "CERTIFICATE", caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (cert, keyFile string) {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "PRIVATE KEY", kder)
	}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}
