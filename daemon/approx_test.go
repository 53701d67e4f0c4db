package daemon

import "testing"

// TestApproxCachePolicy: approximate mode (no KV events) keeps blocks by TTL, or, with the lru
// policy, holds each rank to its KV capacity; with KV events there is no approximate cache.
func TestApproxCachePolicy(t *testing.T) {
	c := Defaults()
	if c.approx() != nil {
		t.Fatal("an approximate cache with KV events on")
	}
	c.NoKVEvents = true
	if a := c.approx(); a == nil || a.LRU {
		t.Fatalf("ttl: %+v", a)
	}
	c.ApproxCachePolicy = "lru"
	if a := c.approx(); a == nil || !a.LRU {
		t.Fatalf("lru: %+v", a)
	}
}
