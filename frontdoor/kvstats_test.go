package frontdoor

import (
	"bufio"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
)

// TestKVStatsStream reads a few lines of GET /v1/kv-cache/stats/stream over a real socket:
// newline-delimited JSON, Dynamo's kv_stats_snapshot shape, snapshot ids that grow, the
// aggregated pool complete once every rank's capacity is known, with its occupancy and the
// routing cache in tokens, and the booked load the router holds.
func TestKVStatsStream(t *testing.T) {
	f := newFixture(t, Config{}, startEngine(t, 1))
	if err := f.r.Register(router.Registration{ID: 1, Model: "m", Capacity: 100}); err != nil {
		t.Fatal(err)
	}
	if err := f.r.Book("m", radix.WorkerKey{ID: 1}, "req", []uint64{1, 2, 3}, 12); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(f.addr + "/v1/kv-cache/stats/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" || resp.StatusCode != 200 {
		t.Fatalf("status %d, content type %q", resp.StatusCode, ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var prev uint64
	for i := range 2 {
		if !sc.Scan() {
			t.Fatalf("line %d: %v", i, sc.Err())
		}
		var snap struct {
			V          int    `json:"v"`
			Type       string `json:"type"`
			SnapshotID uint64 `json:"snapshot_id"`
			ObservedAt int64  `json:"observed_at_unix_ms"`
			Models     []struct {
				Model        string            `json:"model"`
				Aliases      []string          `json:"aliases"`
				RoutingCache map[string]any    `json:"routing_cache"`
				Pools        []json.RawMessage `json:"pools"`
			} `json:"models"`
		}
		if err := json.Unmarshal(sc.Bytes(), &snap); err != nil {
			t.Fatalf("line %d is not JSON: %v\n%s", i, err, sc.Bytes())
		}
		if snap.V != 1 || snap.Type != "kv_stats_snapshot" || snap.SnapshotID <= prev || snap.ObservedAt == 0 {
			t.Fatalf("line %d: %s", i, sc.Bytes())
		}
		prev = snap.SnapshotID
		if len(snap.Models) != 1 || snap.Models[0].Model != "m" || len(snap.Models[0].Pools) != 1 {
			t.Fatalf("models: %s", sc.Bytes())
		}
		// Worker 1, of capacity 100: 100 blocks of 4 tokens.
		want := `{"namespace":"dynamo","component":"backend","endpoint":"generate","role":"aggregated","storage_tier":"device","block_size_tokens":4,` +
			`"expected_ranks":1,"observed_ranks":1,"capacity_blocks":100,"used_blocks":0,"free_blocks":100,"active_decode_blocks":3,"active_prefill_tokens":12,"complete":true}`
		if got := string(snap.Models[0].Pools[0]); got != want {
			t.Errorf("pool:\n got %s\nwant %s", got, want)
		}
		if rc := snap.Models[0].RoutingCache; rc["role"] != "aggregated" || rc["capacity_tokens"] != 400.0 || rc["free_tokens"] != 400.0 || rc["complete"] != true {
			t.Errorf("routing_cache: %v", rc)
		}
	}
}
