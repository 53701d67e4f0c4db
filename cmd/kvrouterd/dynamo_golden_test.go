package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/radix"
)

// goldenStep is one exchange of testdata/dynamo/indexer_steps.json (see its README).
type goldenStep struct {
	Name, Source, Method, Path string
	Body                       json.RawMessage
	Status                     int
	Want                       json.RawMessage
	Kvrouterd                  json.RawMessage
	Why                        string
	WantLen                    *int `json:"want_len"`
	Absent                     []string
}

// TestDynamoGolden plays Dynamo's own requests — the bodies of its documentation and tests,
// every field included — against the daemon, and checks each answer's status, fields and
// values against Dynamo's (testdata/dynamo): the standalone indexer's API, then the selection
// service's whole lifecycle on --selection-addr. The daemon first recovers a Dynamo indexer's
// /dump through --peers: the index the tests query is one a Dynamo indexer wrote.
func TestDynamoGolden(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dump, err := os.ReadFile("testdata/dynamo/indexer_dump.json")
	if err != nil {
		t.Fatal(err)
	}
	checkDumpChains(t, dump)
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/dump" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(dump)
	}))
	defer peer.Close()
	selAddr := freeport.TB(t)
	d := startDaemon(t, buildDaemon(t), "--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--keep-block-tree", "--peers", peer.URL,
		"--selection-addr", selAddr)
	defer d.cmd.Process.Kill()
	// The recovered index dumps the Dynamo dump's device blocks, chains and all (its lower
	// tiers' too: the tiers step queries worker 7's host-pinned block).
	got, want := deviceBlocks(t, []byte(daemonCall(t, d.addr, "GET", "/dump", "", 200))), deviceBlocks(t, dump)
	for key, w := range want {
		if !slices.Equal(got[key], w) {
			t.Errorf("%s: the recovered dump's device blocks\n%v\nwant\n%v", key, got[key], w)
		}
	}
	playGolden(t, "testdata/dynamo/indexer_steps.json", d.addr, peer.URL)
	playGolden(t, "testdata/dynamo/selection_steps.json", selAddr, peer.URL)
}

// playGolden plays the steps of a golden file against addr.
func playGolden(t *testing.T, path, addr, peerURL string) {
	t.Helper()
	var file struct {
		Sources map[string]string
		Steps   []goldenStep
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	for _, s := range file.Steps {
		if file.Sources[s.Source] == "" {
			t.Fatalf("step %q: unknown source %q", s.Name, s.Source)
		}
		var body io.Reader
		if s.Body != nil {
			body = bytes.NewReader(s.Body)
		}
		req, err := http.NewRequest(s.Method, "http://"+addr+s.Path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != s.Status {
			t.Errorf("%s (%s): status %d %s, want %d", s.Name, s.Source, resp.StatusCode, got, s.Status)
			continue
		}
		want := s.Want
		if s.Kvrouterd != nil {
			if s.Why == "" {
				t.Errorf("%s: kvrouterd's answer differs from Dynamo's without a why", s.Name)
			}
			want = s.Kvrouterd
		}
		if want == nil && s.WantLen == nil && s.Absent == nil {
			continue
		}
		var g any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Errorf("%s: the answer is not JSON: %s", s.Name, got)
			continue
		}
		if want != nil {
			var w any
			if err := json.Unmarshal(bytes.ReplaceAll(want, []byte("$PEER"), []byte(peerURL)), &w); err != nil {
				t.Fatalf("%s: want: %v", s.Name, err)
			}
			if path, ok := subset(w, g, ""); !ok {
				t.Errorf("%s (%s): at %q the answer\n%s\ndiffers from\n%s", s.Name, file.Sources[s.Source], path, got, want)
			}
		}
		if s.WantLen != nil {
			if a, ok := g.([]any); !ok || len(a) != *s.WantLen {
				t.Errorf("%s: %s, want %d entries", s.Name, got, *s.WantLen)
			}
		}
		for _, p := range s.Absent {
			if _, ok := lookup(g, p); ok {
				t.Errorf("%s: %s has %s", s.Name, got, p)
			}
		}
	}
}

// subset reports whether got holds want: objects may have more keys, arrays and values must
// be equal; it returns the first path where they differ.
func subset(want, got any, path string) (string, bool) {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return path, false
		}
		for k, v := range w {
			gv, ok := g[k]
			if !ok {
				return path + "." + k, false
			}
			if p, ok := subset(v, gv, path+"."+k); !ok {
				return p, false
			}
		}
		if len(w) == 0 && len(g) != 0 {
			return path, false // {} means empty
		}
		return "", true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return path, false
		}
		for i := range w {
			if p, ok := subset(w[i], g[i], fmt.Sprintf("%s[%d]", path, i)); !ok {
				return p, false
			}
		}
		return "", true
	}
	return path, reflect.DeepEqual(want, got)
}

func lookup(v any, path string) (any, bool) {
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

// goldenDump is a Dynamo dump's JSON, as far as the tests read it.
type goldenDump map[string]struct {
	Events []struct {
		Worker uint64 `json:"worker_id"`
		Tier   string `json:"storage_tier"`
		Event  struct {
			Rank uint32 `json:"dp_rank"`
			Data struct {
				Stored struct {
					Parent *uint64 `json:"parent_hash"`
					Blocks []struct {
						Block  uint64 `json:"block_hash"`
						Tokens uint64 `json:"tokens_hash"`
					} `json:"blocks"`
				} `json:"stored"`
			} `json:"data"`
		} `json:"event"`
	} `json:"events"`
}

// deviceBlocks lists a dump's device-tier blocks per partition, sorted, each as worker, rank,
// parent, engine hash and local hash.
func deviceBlocks(t *testing.T, dump []byte) map[string][]string {
	t.Helper()
	var d goldenDump
	if err := json.Unmarshal(dump, &d); err != nil {
		t.Fatalf("dump: %v", err)
	}
	out := map[string][]string{}
	for key, p := range d {
		for _, e := range p.Events {
			if e.Tier != "device" {
				continue
			}
			parent := "root"
			if e.Event.Data.Stored.Parent != nil {
				parent = fmt.Sprint(*e.Event.Data.Stored.Parent)
			}
			for _, b := range e.Event.Data.Stored.Blocks {
				out[key] = append(out[key], fmt.Sprintf("%d/%d/%s/%d/%d", e.Worker, e.Event.Rank, parent, b.Block, b.Tokens))
				parent = fmt.Sprint(b.Block)
			}
		}
		slices.Sort(out[key])
	}
	return out
}

// checkDumpChains checks that the golden dump's block hashes are Dynamo's chain of its local
// hashes (compute_seq_hash_for_block), as its test helper built them.
func checkDumpChains(t *testing.T, dump []byte) {
	var d goldenDump
	if err := json.Unmarshal(dump, &d); err != nil {
		t.Fatal(err)
	}
	for key, p := range d {
		for _, e := range p.Events {
			st := e.Event.Data.Stored
			parent, has := uint64(0), st.Parent != nil
			if has {
				parent = *st.Parent
			}
			for _, b := range st.Blocks {
				want := b.Tokens
				if has {
					want = radix.SeqHash(parent, b.Tokens)
				}
				if b.Block != want {
					t.Fatalf("%s: block_hash %d of tokens_hash %d, want Dynamo's chain %d", key, b.Block, b.Tokens, want)
				}
				parent, has = b.Block, true
			}
		}
	}
}
