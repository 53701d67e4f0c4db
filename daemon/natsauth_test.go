package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	if n := len((&NATSAuth{NKey: user, TLSCA: "ca.pem"}).Options()); n != 2 {
		t.Fatalf("%d options for an NKey and a CA, want 2", n)
	}
}
