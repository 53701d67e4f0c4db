package ingest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// authStream starts the daemon's event side on an embedded server with its default
// authentication, in dir, feeding r.
func authStream(t *testing.T, dir string, r *router.Router) *Stream {
	t.Helper()
	st, err := StartStream(context.Background(), r, StreamConfig{
		Embedded: EmbeddedConfig{Dir: dir, Listen: "127.0.0.1:0"},
		Consumer: ConsumerConfig{Memory: true},
	}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// violations connects with opts and returns the connection and the permission violations the
// server reports to it.
func violations(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, <-chan error) {
	t.Helper()
	errs := make(chan error, 16)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			select {
			case errs <- err:
			default:
			}
		}
	}))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, errs
}

// refused runs op with a context it cancels once the server reports a permission violation
// naming subject; op must then fail.
func refused(t *testing.T, errs <-chan error, subject string, op func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- op(ctx) }()
	for {
		select {
		case err := <-errs:
			if !strings.Contains(err.Error(), subject) {
				continue
			}
			cancel()
			if err := <-done; err == nil {
				t.Fatalf("%s: succeeded after the server refused it", subject)
			}
			return
		case err := <-done:
			t.Fatalf("%s: returned %v before the server reported a permission violation", subject, err)
		}
	}
}

// TestEmbeddedAuth runs the daemon's event side on an embedded server with its default
// authentication, over TCP: the user files are generated with mode 0600; anonymous clients and
// wrong passwords are refused; a publisher connecting as the README says, with
// ingest.Publisher and UserFile or with a plain client and the file's line in the URL, gets its
// events and load reports into the index, but cannot purge or delete the stream, create a
// consumer or publish on the load-sharing subjects; kvrouterd's own connections (the
// consumer's, those Stream.Dial opens) work; a restart keeps the passwords.
func TestEmbeddedAuth(t *testing.T) {
	dir := t.TempDir()
	r := router.New(router.Config{Shards: 1, Logger: quietLog()})
	defer r.Close()
	st := authStream(t, dir, r)
	defer func() { st.Close() }()

	pubFile := filepath.Join(dir, PublisherFile)
	for _, f := range []string{pubFile, filepath.Join(dir, RouterFile)} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	line, err := os.ReadFile(pubFile)
	if err != nil {
		t.Fatal(err)
	}
	if u, err := ReadUserFile(pubFile); err != nil || u.User != PublisherUser || len(u.Password) != 48 || string(line) != u.User+":"+u.Password+"\n" {
		t.Fatalf("%s: %q (%+v, %v), want one line publisher:<48 hex digits>", pubFile, line, u, err)
	}

	// Anonymous, and a wrong password: refused.
	if nc, err := nats.Connect(st.URL); err == nil {
		nc.Close()
		t.Fatal("an anonymous client was accepted")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous client: %v, want an authorization violation", err)
	}
	if nc, err := nats.Connect(st.URL, nats.UserInfo(PublisherUser, "guess")); err == nil {
		nc.Close()
		t.Fatal("a wrong password was accepted")
	}

	// ingest.Publisher with UserFile: a batch and a load report.
	ctx := context.Background()
	pnc, perrs := violations(t, st.URL, UserFile(pubFile))
	pub, err := NewPublisher(pnc, "")
	if err != nil {
		t.Fatal(err)
	}
	b := &wire.EventBatch{Worker: 1, Model: "m", Events: []kvevent.Event{
		{Kind: kvevent.Stored, ID: 1, BlockSize: 4, Hashes: []uint64{101, 102}, Tokens: toks(0, 8)},
	}}
	if _, err := pub.Batch(ctx, b); err != nil {
		t.Fatal(err)
	}
	// A plain client with the file's line as the URL's user info, publishing an engine batch
	// with JetStream, after checking the stream is there.
	plainURL := "nats://" + strings.TrimSpace(string(line)) + "@" + strings.TrimPrefix(st.URL, "nats://")
	nc2, err := nats.Connect(plainURL)
	if err != nil {
		t.Fatalf("plain client with the file's line in the URL: %v", err)
	}
	defer nc2.Close()
	js2, err := jetstream.New(nc2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js2.Stream(ctx, DefaultStream); err != nil {
		t.Fatalf("the publisher reading the stream's info: %v", err)
	}
	eb := wire.EngineBatch{Events: []kvevent.Event{{Kind: kvevent.Stored, BlockSize: 4, Hashes: []uint64{5, 6}, Tokens: toks(0, 8)}}}
	ack, err := js2.Publish(ctx, EventSubject(DefaultPrefix, "m", 2), wire.AppendEngineBatch(nil, &eb, wire.EngineForm{}))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both batches", func() bool { return st.Consumer.LastSeq() == ack.Sequence })
	if got := cached(t, r, "m", toks(0, 8)); len(got) != 2 || got[1<<8] != 2 || got[2<<8] != 2 {
		t.Fatalf("cached %v, want 2 blocks on workers 1 and 2", got)
	}
	if err := pub.Report(&router.LoadReport{Worker: 1, Model: "m", ActiveBlocks: 7}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the load report", func() bool { return st.Consumer.Stats().Reports == 1 })

	// What the publisher may not do.
	js, err := jetstream.New(pnc)
	if err != nil {
		t.Fatal(err)
	}
	refused(t, perrs, "$JS.API.STREAM.PURGE."+DefaultStream, func(ctx context.Context) error {
		s, err := js.Stream(ctx, DefaultStream)
		if err != nil {
			return err
		}
		return s.Purge(ctx)
	})
	refused(t, perrs, "$JS.API.STREAM.DELETE."+DefaultStream, func(ctx context.Context) error {
		return js.DeleteStream(ctx, DefaultStream)
	})
	refused(t, perrs, "$JS.API.CONSUMER.CREATE."+DefaultStream, func(ctx context.Context) error {
		_, err := js.CreateOrUpdateConsumer(ctx, DefaultStream, jetstream.ConsumerConfig{Name: "spy"})
		return err
	})
	refused(t, perrs, "kvr.active.A", func(ctx context.Context) error {
		if err := pnc.Publish("kvr.active.A", []byte("KVRA")); err != nil {
			return err
		}
		<-ctx.Done() // a plain publish is not answered: the violation is the refusal
		return ctx.Err()
	})
	refused(t, perrs, "kvr.events.>", func(ctx context.Context) error {
		if _, err := pnc.SubscribeSync("kvr.events.>"); err != nil {
			return err
		}
		if err := pnc.Flush(); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	})
	// Nothing the publisher tried changed the stream; kvrouterd's own user reads it.
	rjs, err := jetstream.New(st.Conn)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := rjs.Stream(ctx, DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	if info := stream.CachedInfo(); info.State.Msgs != 2 {
		t.Fatalf("stream after the publisher's attempts: %+v, want its 2 messages", info.State)
	}

	// Load sharing on kvrouterd's user: a connection from Dial publishes on the share subject.
	sc, err := st.Dial("kvrouterd-share", nats.NoEcho())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	sub, err := st.Conn.SubscribeSync(DefaultPrefix + ".active.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := sc.Publish(DefaultPrefix+".active.A", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(30 * time.Second); err != nil {
		t.Fatalf("load sharing as kvrouterd: %v", err)
	}

	// A restart keeps the passwords: the publisher's file still works.
	st.Close()
	r2 := router.New(router.Config{Shards: 1, Logger: quietLog()})
	defer r2.Close()
	st = authStream(t, dir, r2)
	if again, err := os.ReadFile(pubFile); err != nil || string(again) != string(line) {
		t.Fatalf("after a restart %s holds %q (%v), want %q", pubFile, again, err, line)
	}
	nc3, err := nats.Connect(st.URL, UserFile(pubFile))
	if err != nil {
		t.Fatalf("publisher after a restart: %v", err)
	}
	nc3.Close()
	if nc, err := nats.Connect(st.PublisherURL()); err != nil {
		t.Fatalf("PublisherURL: %v", err)
	} else {
		nc.Close()
	}
}

// TestUserFiles checks reading and generating user files: a file that does not parse, or names
// another user, is an error and left alone (publishers may hold its password); a file others
// could read is tightened to 0600.
func TestUserFiles(t *testing.T) {
	f := func(content, want string) {
		t.Helper()
		dir := t.TempDir()
		p := filepath.Join(dir, PublisherFile)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := EmbeddedCredentials(dir)
		if err == nil || !errors.Is(err, ErrUserFile) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%q: %v, want an ErrUserFile naming %q", content, err, want)
		}
		if b, _ := os.ReadFile(p); string(b) != content {
			t.Fatalf("%q was replaced by %q", content, b)
		}
	}
	f("", "user:password")
	f("publisher\n", "user:password")
	f("publisher:\n", "user:password")
	f("publisher:a b\n", "spaces")
	f("publisher:a\nx\n", "more than one line")
	f("kvrouterd:abc\n", `want "publisher"`)

	dir := t.TempDir()
	p := filepath.Join(dir, PublisherFile)
	if err := os.WriteFile(p, []byte("publisher:secret\r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := EmbeddedCredentials(dir)
	if err != nil || c.Publisher.Password != "secret" || c.Router.User != RouterUser || c.Router.Password == "" {
		t.Fatalf("%+v %v", c, err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode after reading: %v %v, want 0600", fi.Mode().Perm(), err)
	}
	c2, err := EmbeddedCredentials(dir)
	if err != nil || *c2 != *c {
		t.Fatalf("second read %+v %v, want %+v", c2, err, c)
	}
}
