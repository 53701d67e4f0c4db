package daemon

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// NATSAuth is how a connection to a NATS server authenticates: an external one, or another
// kvrouterd's embedded one (UserFile).
type NATSAuth struct {
	Creds, UserFile, NKey, TLSCA, TLSCert, TLSKey string
}

// Flags defines the flags that set a.
func (a *NATSAuth) Flags(fs *flag.FlagSet) {
	fs.StringVar(&a.Creds, "nats-creds", a.Creds, "credentials file (JWT and NKey) for the NATS server")
	fs.StringVar(&a.UserFile, "nats-user-file", a.UserFile, "file holding one line user:password for the NATS server, such as a kvrouterd's --data-dir/nats/publisher.auth")
	fs.StringVar(&a.NKey, "nats-nkey", a.NKey, "file holding the NKey seed (SU…) of a user of the NATS server's authorization.users")
	fs.StringVar(&a.TLSCA, "nats-tls-ca", a.TLSCA, "CA certificate file to verify the NATS servers")
	fs.StringVar(&a.TLSCert, "nats-tls-cert", a.TLSCert, "client certificate file (with --nats-tls-key)")
	fs.StringVar(&a.TLSKey, "nats-tls-key", a.TLSKey, "client key file")
}

// Check says which flag of a is wrong, or nil.
func (a *NATSAuth) Check() error {
	if (a.TLSCert == "") != (a.TLSKey == "") {
		return fmt.Errorf("--nats-tls-cert and --nats-tls-key go together")
	}
	if n := btoi(a.Creds != "") + btoi(a.UserFile != "") + btoi(a.NKey != ""); n > 1 {
		return fmt.Errorf("--nats-creds, --nats-user-file and --nats-nkey: give one")
	}
	if a.Creds != "" {
		if err := checkCreds(a.Creds); err != nil {
			return fmt.Errorf("--nats-creds %s: %w", a.Creds, err)
		}
	}
	if a.NKey != "" {
		if _, err := nats.NkeyOptionFromSeed(a.NKey); err != nil {
			return fmt.Errorf("--nats-nkey %s: %w", a.NKey, err)
		}
	}
	if a.UserFile != "" {
		if _, err := ingest.ReadUserFile(a.UserFile); err != nil {
			return fmt.Errorf("--nats-user-file: %w", err)
		}
	}
	return nil
}

// Options are the connect options that authenticate as a says.
func (a *NATSAuth) Options() []nats.Option {
	var opts []nats.Option
	if a.Creds != "" {
		opts = append(opts, nats.UserCredentials(a.Creds))
	}
	if a.UserFile != "" {
		opts = append(opts, ingest.UserFile(a.UserFile))
	}
	if a.NKey != "" {
		// The seed is read again at each connection, to sign the server's nonce.
		o, err := nats.NkeyOptionFromSeed(a.NKey)
		if err != nil {
			o = func(*nats.Options) error { return fmt.Errorf("--nats-nkey %s: %w", a.NKey, err) }
		}
		opts = append(opts, o)
	}
	if a.TLSCA != "" {
		opts = append(opts, nats.RootCAs(a.TLSCA))
	}
	if a.TLSCert != "" {
		opts = append(opts, nats.ClientCert(a.TLSCert, a.TLSKey))
	}
	return opts
}

// checkCreds reads a creds file as the NATS client does at each connection, so that a wrong
// file fails the start naming the flag rather than the first connection with the key parser's
// words: a user's JWT, then the NKey seed of that same user.
func checkCreds(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	const want = "want a creds file (nsc generate creds): a user's JWT, then its NKey seed, each between ----- lines"
	token, err := nkeys.ParseDecoratedJWT(b)
	if err != nil {
		return fmt.Errorf("%w; %s", err, want)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return fmt.Errorf("no user JWT (%v); %s", err, want)
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return fmt.Errorf("no user NKey seed (%v); %s", err, want)
	}
	if pub, err := kp.PublicKey(); err != nil || pub != uc.Subject {
		return fmt.Errorf("the seed is not the key of the JWT's user %s", uc.Subject)
	}
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
