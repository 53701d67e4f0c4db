package ingest

// Authentication on the embedded NATS server.
//
// The embedded server listens on a TCP port for publishers on the host, so without
// authentication any local process could inject events, purge the stream or delete it. By
// default it knows two users, whose passwords are generated once (crypto/rand) into the
// server's directory and reused on every restart, so publishers configured once keep working:
//
//	<dir>/kvrouterd.auth   kvrouterd:<password>   every right: the stream, its consumers, load sharing
//	<dir>/publisher.auth   publisher:<password>   publish <prefix>.events.> and <prefix>.load.>,
//	                                              read the stream's info, receive replies (_INBOX.>)
//
// Each file is one line, "user:password", mode 0600; the password is 48 hex digits, so the line
// can go as it is into a URL's user info: nats://$(cat publisher.auth)@127.0.0.1:4222. Every
// NATS client in every language takes a user and password, in the URL or as options. The
// publisher user cannot call the JetStream API beyond reading the stream's info: no purge, no
// delete, no consumer; nor publish on <prefix>.active.>, the replicas' load sharing. A file is
// generated only when it is missing; one that does not parse is an error, not replaced, since
// publishers may hold the password it had.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/crypto/bcrypt"
)

// Users of the embedded server, and the files in its directory that hold their passwords.
const (
	RouterUser    = "kvrouterd"
	PublisherUser = "publisher"
	RouterFile    = RouterUser + ".auth"
	PublisherFile = PublisherUser + ".auth"
)

// ErrUserFile is wrapped by every error about the contents of a user file.
var ErrUserFile = errors.New("ingest: user file")

// UserPass is one user of a NATS server; a plain value.
type UserPass struct {
	User, Password string
	// File is where it was read from (empty if it was not).
	File string
}

// Option is the nats.Option that authenticates as u.
func (u UserPass) Option() nats.Option { return nats.UserInfo(u.User, u.Password) }

// Credentials are the embedded server's two users; a plain value.
type Credentials struct {
	Router, Publisher UserPass
}

// EmbeddedCredentials reads the users of the embedded server whose directory is dir, generating
// each user file that is missing (mode 0600, dir created 0700 if needed). A file that exists is
// kept as it is; if its mode lets others read it, it is tightened to 0600.
func EmbeddedCredentials(dir string) (*Credentials, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("nats credentials: %w", err)
	}
	var c Credentials
	var err error
	if c.Router, err = loadOrCreateUser(filepath.Join(dir, RouterFile), RouterUser); err != nil {
		return nil, err
	}
	if c.Publisher, err = loadOrCreateUser(filepath.Join(dir, PublisherFile), PublisherUser); err != nil {
		return nil, err
	}
	return &c, nil
}

func loadOrCreateUser(path, user string) (UserPass, error) {
	u, err := ReadUserFile(path)
	if err == nil {
		if u.User != user {
			return u, fmt.Errorf("%w %s: user %q, want %q (delete the file to generate a new one)", ErrUserFile, path, u.User, user)
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(path, 0o600); err != nil {
				return u, fmt.Errorf("nats credentials: %w", err)
			}
		}
		return u, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return u, err
	}
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return u, fmt.Errorf("nats credentials: %w", err)
	}
	u = UserPass{User: user, Password: hex.EncodeToString(raw[:]), File: path}
	// Written aside and renamed: a crash leaves either no file or a whole one.
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return u, fmt.Errorf("nats credentials: %w", err)
	}
	_, err = f.WriteString(u.User + ":" + u.Password + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return u, fmt.Errorf("nats credentials: %w", err)
	}
	return u, nil
}

// ReadUserFile reads a user file: one line "user:password" (a trailing newline is allowed).
func ReadUserFile(path string) (UserPass, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return UserPass{}, err
	}
	line := bytes.TrimRight(b, "\r\n")
	user, pass, ok := bytes.Cut(line, []byte(":"))
	switch {
	case !ok || len(user) == 0 || len(pass) == 0:
		return UserPass{}, fmt.Errorf("%w %s: want one line user:password", ErrUserFile, path)
	case bytes.ContainsAny(line, "\r\n \t"):
		return UserPass{}, fmt.Errorf("%w %s: a line with spaces or more than one line", ErrUserFile, path)
	}
	return UserPass{User: string(user), Password: string(pass), File: path}, nil
}

// UserFile is a nats.Option that authenticates with the user file at path (ReadUserFile),
// read when the connection is made: how publishers in Go connect to the embedded server with
// its publisher.auth.
func UserFile(path string) nats.Option {
	return func(o *nats.Options) error {
		u, err := ReadUserFile(path)
		if err != nil {
			return err
		}
		o.User, o.Password = u.User, u.Password
		return nil
	}
}

// users are the embedded server's users for c: kvrouterd unrestricted, the publisher allowed
// only what publishing events and load reports takes. The server keeps bcrypt hashes, at the
// lowest cost: the passwords are 192 random bits, which no guessing reaches, so a dearer hash
// would only slow every connection down.
func (c *Credentials) users(prefix, stream string) ([]*server.User, error) {
	hash := func(p string) (string, error) {
		h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		return string(h), err
	}
	rp, err := hash(c.Router.Password)
	if err != nil {
		return nil, fmt.Errorf("nats credentials: %w", err)
	}
	pp, err := hash(c.Publisher.Password)
	if err != nil {
		return nil, fmt.Errorf("nats credentials: %w", err)
	}
	return []*server.User{
		{Username: c.Router.User, Password: rp},
		{Username: c.Publisher.User, Password: pp, Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{
				prefix + ".events.>",
				prefix + ".load.>",
				// Read-only: lets a publisher check that the stream is there before it starts.
				"$JS.API.STREAM.INFO." + stream,
			}},
			// The replies: JetStream's publish acknowledgements and the info answer.
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}},
	}, nil
}
