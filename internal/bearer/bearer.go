// Package bearer checks HTTP bearer tokens (RFC 6750) against a token file, in time that does
// not depend on how much of a token matches, and reloads the file when it changes.
//
// The file holds one token a line; a line may name the token's class first, "read TOKEN" or
// "write TOKEN" (a token alone is "write"). Blank lines and lines starting with '#' are
// skipped. A token is at least MinTokenLen bytes of printable ASCII without spaces.
//
// Tokens are safe for concurrent use: Check runs on every request, lock-free and without
// allocating, while Reload swaps the whole set at once.
package bearer

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Class is what a token may do. Classes are ordered: a class allows what every lower one does.
type Class uint8

const (
	// None is no valid token: only what is open to everyone.
	None Class = iota
	// Read allows the endpoints that change nothing: matches, queries, listings, dumps.
	Read
	// Write allows every endpoint.
	Write
)

func (c Class) String() string {
	switch c {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return "none"
}

// MinTokenLen is the shortest token a file may hold: 16 bytes, 128 bits of a random token
// written as base64 or hex, and a guard against a placeholder left in the file.
const MinTokenLen = 16

// ErrFile is wrapped by every error about the token file's contents.
var ErrFile = errors.New("bearer: token file")

type entry struct {
	sum   [sha256.Size]byte
	class Class
}

// Tokens is a token file's tokens. Safe for concurrent use.
type Tokens struct {
	path string
	set  atomic.Pointer[[]entry]

	mu   sync.Mutex // serializes Reload
	stat fileStat   // REQUIRES mu
}

type fileStat struct {
	mod  time.Time
	size int64
}

// Load reads the token file at path. A file without a single token is an error: a daemon asked
// to require tokens must not start open or closed to everyone by mistake.
func Load(path string) (*Tokens, error) {
	t := &Tokens{path: path}
	if _, err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Path is the token file's path.
func (t *Tokens) Path() string { return t.path }

// Len is how many tokens are in force.
func (t *Tokens) Len() int { return len(*t.set.Load()) }

// Reload reads the file again if its size or modification time changed since the last read,
// and reports whether the tokens changed. A file that cannot be read or parsed leaves the
// tokens in force as they were.
func (t *Tokens) Reload() (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fi, err := os.Stat(t.path)
	if err != nil {
		return false, fmt.Errorf("bearer: %w", err)
	}
	st := fileStat{fi.ModTime(), fi.Size()}
	if t.set.Load() != nil && st == t.stat {
		return false, nil
	}
	b, err := os.ReadFile(t.path)
	if err != nil {
		return false, fmt.Errorf("bearer: %w", err)
	}
	set, err := parse(b)
	if err != nil {
		return false, fmt.Errorf("%s: %w", t.path, err)
	}
	t.set.Store(&set)
	t.stat = st
	return true, nil
}

// parse reads a token file's contents (see the package doc).
func parse(b []byte) ([]entry, error) {
	var set []entry
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		class, tok := Write, line
		if f := strings.Fields(line); len(f) == 2 {
			switch f[0] {
			case "read":
				class = Read
			case "write":
			default:
				return nil, fmt.Errorf("%w: line %d: class %q: want read or write", ErrFile, n, f[0])
			}
			tok = f[1]
		} else if len(f) > 2 {
			return nil, fmt.Errorf("%w: line %d: want [read|write] TOKEN", ErrFile, n)
		}
		if len(tok) < MinTokenLen {
			return nil, fmt.Errorf("%w: line %d: a token of %d bytes: want at least %d (e.g. openssl rand -hex 32)", ErrFile, n, len(tok), MinTokenLen)
		}
		for i := 0; i < len(tok); i++ {
			if tok[i] < 0x21 || tok[i] > 0x7e {
				return nil, fmt.Errorf("%w: line %d: byte %d of the token is not printable ASCII", ErrFile, n, i)
			}
		}
		set = append(set, entry{sha256.Sum256([]byte(tok)), class})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFile, err)
	}
	if len(set) == 0 {
		return nil, fmt.Errorf("%w: no token", ErrFile)
	}
	return set, nil
}

// Check returns the class of the token in an Authorization header's value ("Bearer TOKEN";
// the scheme in any case), or None when there is none or it is unknown. It compares the token's
// SHA-256 with every token's, whatever the outcome, so its time tells nothing of the tokens.
func (t *Tokens) Check(authorization []byte) Class {
	tok, ok := Token(authorization)
	if !ok {
		return None
	}
	sum := sha256.Sum256(tok)
	class := None
	for _, e := range *t.set.Load() {
		if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 && e.class > class {
			class = e.class
		}
	}
	return class
}

// Token returns the token of an Authorization header's value, "Bearer TOKEN", or false.
func Token(authorization []byte) ([]byte, bool) {
	const scheme = "bearer "
	a := bytes.TrimSpace(authorization)
	if len(a) <= len(scheme) {
		return nil, false
	}
	for i := 0; i < len(scheme); i++ {
		c := a[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != scheme[i] {
			return nil, false
		}
	}
	return bytes.TrimLeft(a[len(scheme):], " "), true
}

// Challenge is the WWW-Authenticate header's value of a 401.
const Challenge = `Bearer realm="kvrouterd"`

// Refusal is what a request whose Authorization header's value is authorization gets when its
// endpoint needs class need: status 0 and no message when it may go on, 401 when it has no
// known token (send Challenge with it), 403 for a read token where a write one is needed. The
// messages name the header and the flag, for any API's error shape.
func (t *Tokens) Refusal(authorization []byte, need Class) (status int, msg string) {
	if need == None {
		return 0, ""
	}
	switch got := t.Check(authorization); {
	case got >= need:
		return 0, ""
	case got == None:
		return http.StatusUnauthorized, "a bearer token is required: send the header Authorization: Bearer TOKEN with a token of kvrouterd's --auth-token-file"
	}
	return http.StatusForbidden, "this token may only read: the request needs a write token of kvrouterd's --auth-token-file"
}
