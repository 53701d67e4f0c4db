package server

import (
	"encoding/json"
	"testing"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
)

// TestRoutePredictedTTFTJSON: under the default cost a JSON route answer carries the chosen
// worker's predicted TTFT as predicted_ttft_ms; a match, which chooses none, does not.
func TestRoutePredictedTTFTJSON(t *testing.T) {
	h := newHarnessWith(t, func(c *router.Config) { c.Cost = scoring.CostTTFT })
	if err := h.c.Register(client.Worker{ID: 1, Model: "m", BlockSize: 4}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want bool
	}{{"/v1/route", true}, {"/v1/match", false}} {
		code, body := h.post(c.path, "application/json", []byte(`{"request_id":"p1","model":"m","token_ids":[1,2,3,4,5,6,7,8,9]}`))
		var a struct {
			Predicted *float64 `json:"predicted_ttft_ms"`
		}
		if code != 200 || json.Unmarshal([]byte(body), &a) != nil {
			t.Fatalf("%s: %d %s", c.path, code, body)
		}
		if (a.Predicted != nil && *a.Predicted > 0) != c.want {
			t.Fatalf("%s: predicted_ttft_ms in %s", c.path, body)
		}
	}
}
