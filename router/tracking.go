package router

import (
	"github.com/puzpuzpuz/xsync/v4"

	"github.com/kvrouterd/kvrouterd/radix"
)

// Keyed tracking identities (Config.TrackingKey). A request's blocks are matched against the
// index by their public sequence hashes (scratch.seqs) and booked as active under identities
// derived from the provider's key (scratch.tseqs), so that one who can compute public hashes
// cannot tell which prompts are active, and routers under different keys share no active block.
// Without a key, and for requests given by hash, the two are the same slice.

// trackingGroup is the routing group of every kvrouterd request: Dynamo's default one.
const trackingGroup = "default"

// maxLoRASeeds bounds the adapters whose seeds a model keeps; past it, a request of another
// adapter derives its seeds anew (one BLAKE3 hash).
const maxLoRASeeds = 1024

// trackSeeds is a model's tracking seeds: derived once for its base model, once per adapter.
// Written once before the model is published, then read by any goroutine; lora is safe for
// concurrent use.
type trackSeeds struct {
	key          *radix.TrackingKey // nil: no keyed tracking
	block, chain uint64             // the base model's (no adapter)
	lora         *xsync.Map[string, [2]uint64]
}

// initTracking derives m's tracking seeds, if the router has a tracking key. REQUIRES m not
// yet published.
func (r *Router) initTracking(m *model) {
	k := r.cfg.TrackingKey
	if k == nil {
		return
	}
	m.track.key = k
	m.track.block, m.track.chain = k.Seeds(m.trackingScope(""))
	m.track.lora = xsync.NewMap[string, [2]uint64]()
}

func (m *model) trackingScope(lora string) radix.TrackingScope {
	return radix.TrackingScope{Model: m.name, Group: trackingGroup, BlockSize: m.blockSize, LoRA: lora}
}

// seeds returns the tracking seeds of m's requests of adapter lora ("" for the base model).
func (t *trackSeeds) seeds(m *model, lora string) (block, chain uint64) {
	if lora == "" {
		return t.block, t.chain
	}
	if s, ok := t.lora.Load(lora); ok {
		return s[0], s[1]
	}
	block, chain = t.key.Seeds(m.trackingScope(lora))
	if t.lora.Size() < maxLoRASeeds {
		t.lora.Store(lora, [2]uint64{block, chain})
	}
	return block, chain
}
