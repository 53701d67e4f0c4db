package router

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestAPIKey: a worker's registered API key comes back from HTTPWorkers for the front door,
// Config.APIKeys' wins over it, a later registration naming none leaves it, one naming another
// replaces it; a key that does not fit an Authorization header is refused without being quoted;
// the listing says only that there is one; a snapshot keeps the registered key.
func TestAPIKey(t *testing.T) {
	const key, other, fileKey = "sk-registered-0123456789", "sk-replaced-0123456789", "sk-from-the-file-0123"
	r := New(Config{Shards: 1, Logger: quiet(), APIKeys: func(id uint64, endpoint string) (string, bool) {
		if id == 3 || endpoint == "http://w4:8000" {
			return fileKey, true
		}
		return "", false
	}})
	defer r.Close()
	for _, g := range []Registration{
		{ID: 1, Model: "m", BlockSize: 4, HTTPEndpoint: "http://w1:8000", APIKey: key},
		{ID: 2, Model: "m", HTTPEndpoint: "http://w2:8000"},
		{ID: 3, Model: "m", HTTPEndpoint: "http://w3:8000", APIKey: key},
		{ID: 4, Model: "m", HTTPEndpoint: "http://w4:8000"},
		{ID: 1, Model: "m", Ranks: []uint32{1}}, // names no key: keeps worker 1's
	} {
		if err := r.Register(g); err != nil {
			t.Fatal(err)
		}
	}
	want := map[uint64]string{1: key, 2: "", 3: fileKey, 4: fileKey}
	check := func(r *Router, want map[uint64]string) {
		t.Helper()
		ws := r.HTTPWorkers("m", nil)
		if len(ws) != len(want) {
			t.Fatalf("%d HTTP workers, want %d", len(ws), len(want))
		}
		for _, w := range ws {
			if w.APIKey != want[w.ID] {
				t.Errorf("worker %d: key %q, want %q", w.ID, w.APIKey, want[w.ID])
			}
		}
		infos := r.Workers()
		for _, w := range infos {
			if w.APIKeySet != (want[w.ID] != "") {
				t.Errorf("worker %d rank %d lists api_key_set %v", w.ID, w.Rank, w.APIKeySet)
			}
		}
		b, _ := json.Marshal(infos)
		if strings.Contains(string(b), "sk-") {
			t.Errorf("the listing shows a key: %s", b)
		}
	}
	check(r, want)

	if err := r.Register(Registration{ID: 1, Model: "m", APIKey: other}); err != nil {
		t.Fatal(err)
	}
	want[1] = other
	check(r, want)

	for _, bad := range []string{"sk with space", "sk-\r\nX-Injected: 1", "sk-\x00", "sk-é", strings.Repeat("k", 1025)} {
		var fe *FieldError
		err := r.Register(Registration{ID: 5, Model: "m", HTTPEndpoint: "http://w5:8000", APIKey: bad})
		if !errors.As(err, &fe) || fe.Field != "api_key" {
			t.Errorf("key %q: %v, want a refusal naming api_key", bad, err)
		} else if strings.Contains(err.Error(), "sk") || strings.Contains(err.Error(), "kkk") {
			t.Errorf("the refusal quotes the key: %v", err)
		}
	}

	// The snapshot holds the registered keys, not the lookup's: a restored router without
	// the lookup forwards with what the workers registered.
	to, _ := restored(t, r, 1<<20)
	check(to, map[uint64]string{1: other, 2: "", 3: key, 4: ""})
}
