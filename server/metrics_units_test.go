package server

import (
	"strconv"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/client"
)

// TestMetricsOneUnitPerSeries: a worker rank's load is one series per unit (cached and active
// blocks, active prefill tokens, active requests), beside the deprecated kvrouterd_worker_load
// which keeps the same values by kind; the API's requests are counted by endpoint and status
// code; the prompt tokens routed and those cached on the worker chosen are counters, whose
// ratio is the hit rate.
func TestMetricsOneUnitPerSeries(t *testing.T) {
	h := newHarness(t)
	for id := uint64(1); id <= 2; id++ {
		if err := h.c.Register(client.Worker{ID: id, Model: "m", BlockSize: 4}); err != nil {
			t.Fatal(err)
		}
	}
	h.store(2, 1, 700, 0, tokens(1, 8))
	if resp := h.route("r1", tokens(1, 9), 0); resp.Worker != 2 {
		t.Fatalf("routed to %d", resp.Worker)
	}
	h.route("r2", tokens(100, 6), 1) // pinned to worker 1: 6 prompt tokens, none cached
	h.route("r3", tokens(1, 9), 1)   // pinned to worker 1: 8 tokens cached on worker 2, none here
	h.post("/v1/route", "", []byte(`{"model":"m"}`))
	h.post("/v1/route", "", make([]byte, 65<<10))

	_, page := h.get("/metrics")
	f := func(sample string, want float64) {
		t.Helper()
		for line := range strings.SplitSeq(page, "\n") {
			if v, ok := strings.CutPrefix(line, sample+" "); ok {
				if got, err := strconv.ParseFloat(v, 64); err != nil || got != want {
					t.Fatalf("%s = %s, want %v", sample, v, want)
				}
				return
			}
		}
		t.Fatalf("no %s in /metrics", sample)
	}
	w2 := `{dp_rank="0",model="m",worker="2"}`
	f("kvrouterd_worker_cached_blocks"+w2, 2)
	f("kvrouterd_worker_active_blocks"+w2, 2)
	f("kvrouterd_worker_active_prefill_tokens"+w2, 1)
	f("kvrouterd_worker_active_requests"+w2, 1)
	f(`kvrouterd_worker_load{dp_rank="0",kind="active_blocks",model="m",worker="2"}`, 2)
	f(`kvrouterd_worker_load{dp_rank="0",kind="active_prefill_tokens",model="m",worker="2"}`, 1)
	f(`kvrouterd_worker_active_prefill_tokens{dp_rank="0",model="m",worker="1"}`, 6+9)

	f("kvrouterd_routed_prompt_tokens_total", 9+6+9)
	f("kvrouterd_routed_cached_tokens_total", 8)
	// The hit available (the longest prefix anywhere) against the hit achieved, per model.
	f(`kvrouterd_model_prompt_tokens_total{model="m"}`, 9+6+9)
	f(`kvrouterd_model_available_hit_tokens_total{model="m"}`, 8+0+8)
	f(`kvrouterd_model_achieved_hit_tokens_total{model="m"}`, 8)

	f(`kvrouterd_http_requests_total{code="201",endpoint="workers"}`, 2)
	f(`kvrouterd_http_requests_total{code="200",endpoint="events"}`, 1)
	f(`kvrouterd_http_requests_total{code="200",endpoint="route"}`, 3)
	f(`kvrouterd_http_requests_total{code="400",endpoint="route"}`, 1)
	f(`kvrouterd_http_requests_total{code="413",endpoint="any"}`, 1)
}
