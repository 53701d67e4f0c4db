package daemon

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

func TestNATSAuthCheck(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, body []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, body, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	seed := func(kp nkeys.KeyPair, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		s, err := kp.Seed()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	user := file("user.nk", seed(nkeys.CreateUser()))
	account := file("account.nk", seed(nkeys.CreateAccount()))
	users := file("users.auth", []byte("kvrouterd:secret\n"))
	// creds is a creds file of a new user signed by a new account, with the seed of another
	// user if mismatched.
	creds := func(name string, mismatched bool) string {
		t.Helper()
		acct, err := nkeys.CreateAccount()
		if err != nil {
			t.Fatal(err)
		}
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		token, err := jwt.NewUserClaims(pub).Encode(acct)
		if err != nil {
			t.Fatal(err)
		}
		s := seed(kp, nil)
		b, err := jwt.FormatUserConfig(token, s)
		if err != nil {
			t.Fatal(err)
		}
		if mismatched { // which FormatUserConfig refuses to write
			b = bytes.Replace(b, s, seed(nkeys.CreateUser()), 1)
		}
		return file(name, b)
	}
	f := func(a NATSAuth, want string) {
		t.Helper()
		err := a.Check()
		if want == "" {
			if err != nil {
				t.Fatalf("%+v: %v", a, err)
			}
			return
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%+v: error %v, want it to say %q", a, err, want)
		}
	}
	f(NATSAuth{NKey: user}, "")
	f(NATSAuth{NKey: filepath.Join(dir, "none.nk")}, "--nats-nkey")
	f(NATSAuth{NKey: file("junk.nk", []byte("not a seed\n"))}, "--nats-nkey")
	f(NATSAuth{NKey: account}, "--nats-nkey")
	f(NATSAuth{NKey: user, UserFile: users}, "give one")
	f(NATSAuth{NKey: user, Creds: "x.creds"}, "give one")
	f(NATSAuth{Creds: "x.creds", UserFile: users}, "give one")
	f(NATSAuth{Creds: creds("user.creds", false)}, "")
	f(NATSAuth{Creds: filepath.Join(dir, "none.creds")}, "--nats-creds")
	f(NATSAuth{Creds: users}, "--nats-creds "+users+": no user JWT")
	f(NATSAuth{Creds: user}, "--nats-creds "+user+": no user JWT")
	f(NATSAuth{Creds: creds("mismatched.creds", true)}, "the seed is not the key of the JWT's user")
	if n := len((&NATSAuth{NKey: user, TLSCA: "ca.pem"}).Options()); n != 2 {
		t.Fatalf("%d options for an NKey and a CA, want 2", n)
	}
}
