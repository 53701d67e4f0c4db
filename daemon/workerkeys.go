package daemon

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// errKeysFile is wrapped by every error about --worker-api-keys-file's contents. The errors name
// the line, never the key.
var errKeysFile = errors.New("worker API keys file")

// workerKeys is --worker-api-keys-file: the API key the front door sends each worker's HTTP API,
// by worker id or by http_endpoint. The file holds one "WHO KEY" a line, WHO a worker id (a
// decimal integer) or an http_endpoint (http:// or https://, as registered; a trailing slash
// does not count); blank lines and lines starting with '#' are skipped. A key is printable
// ASCII without spaces. A worker's id line wins over its endpoint's, and either over the key it
// registered. Safe for concurrent use: Lookup runs under the router's registry lock, lock-free,
// while Reload swaps the whole set at once.
type workerKeys struct {
	path string
	set  atomic.Pointer[keySet]

	mu   sync.Mutex // serializes Reload
	stat keysStat   // REQUIRES mu
}

type keySet struct {
	byID       map[uint64]string
	byEndpoint map[string]string
}

type keysStat struct {
	mod  time.Time
	size int64
}

// loadWorkerKeys reads the file at path; one that does not parse fails the start.
func loadWorkerKeys(path string) (*workerKeys, error) {
	k := &workerKeys{path: path}
	if _, err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Path is the file's path.
func (k *workerKeys) Path() string { return k.path }

// Len is how many keys are in force.
func (k *workerKeys) Len() int {
	s := k.set.Load()
	return len(s.byID) + len(s.byEndpoint)
}

// Lookup returns the key for worker id serving its API at endpoint, if the file has one: by
// the id, else by the endpoint. It is router.Config.APIKeys.
func (k *workerKeys) Lookup(id uint64, endpoint string) (string, bool) {
	s := k.set.Load()
	if key, ok := s.byID[id]; ok {
		return key, true
	}
	key, ok := s.byEndpoint[strings.TrimSuffix(endpoint, "/")]
	return key, ok
}

// Reload reads the file again if its size or modification time changed since the last read,
// and reports whether the keys changed. A file that cannot be read or parsed leaves the keys in
// force as they were.
func (k *workerKeys) Reload() (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	fi, err := os.Stat(k.path)
	if err != nil {
		return false, fmt.Errorf("%w: %v", errKeysFile, err)
	}
	st := keysStat{fi.ModTime(), fi.Size()}
	if k.set.Load() != nil && st == k.stat {
		return false, nil
	}
	b, err := os.ReadFile(k.path)
	if err != nil {
		return false, fmt.Errorf("%w: %v", errKeysFile, err)
	}
	set, err := parseWorkerKeys(b)
	if err != nil {
		return false, fmt.Errorf("%s: %w", k.path, err)
	}
	k.set.Store(set)
	k.stat = st
	return true, nil
}

// parseWorkerKeys reads a keys file's contents (see workerKeys). An empty file is no error:
// every worker then sends the key it registered, if any.
func parseWorkerKeys(b []byte) (*keySet, error) {
	s := &keySet{byID: map[uint64]string{}, byEndpoint: map[string]string{}}
	seen := map[string]int{} // WHO → its line
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("%w: line %d: %d fields, want WORKER_ID KEY or HTTP_ENDPOINT KEY", errKeysFile, n, len(f))
		}
		who, key := f[0], f[1]
		for i := 0; i < len(key); i++ {
			if key[i] < 0x21 || key[i] > 0x7e {
				return nil, fmt.Errorf("%w: line %d: byte %d of the key is not printable ASCII", errKeysFile, n, i)
			}
		}
		if id, err := strconv.ParseUint(who, 10, 64); err == nil {
			who = strconv.FormatUint(id, 10)
			s.byID[id] = key
		} else {
			u, err := url.Parse(who)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return nil, fmt.Errorf("%w: line %d: %q is neither a worker id nor an http:// or https:// endpoint", errKeysFile, n, who)
			}
			who = strings.TrimSuffix(who, "/")
			s.byEndpoint[who] = key
		}
		if prev, dup := seen[who]; dup {
			return nil, fmt.Errorf("%w: line %d: %s has a key on line %d already", errKeysFile, n, who, prev)
		}
		seen[who] = n
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", errKeysFile, err)
	}
	return s, nil
}
