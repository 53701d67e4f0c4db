package fleet

import (
	"container/list"
	"math/rand/v2"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// GIEConfig is the Gateway API inference extension's default scheduling profile and its
// approximate prefix cache; a plain value.
type GIEConfig struct {
	// Score weights of the default profile: prefix-cache-scorer 3, queue-scorer 2,
	// kv-cache-utilization-scorer 2.
	PrefixWeight, QueueWeight, KVWeight float64
	// BlockSize is the prefix hash's block in tokens. The default, autoTune, takes the engine's
	// own block size from its metrics (16 tokens without them).
	BlockSize int
	// MaxBlocks is how many leading blocks of a prompt are hashed (256).
	MaxBlocks int
	// LRUCapacity is each worker's LRU of block hashes, in entries. autoTune takes the engine's
	// KV blocks from its metrics (31,250 without them).
	LRUCapacity int
}

// DefaultGIEConfig is GIE's default profile with autoTune on, for workers of blockSize tokens
// per block and blocks KV blocks.
func DefaultGIEConfig(blockSize, blocks int) GIEConfig {
	return GIEConfig{PrefixWeight: 3, QueueWeight: 2, KVWeight: 2, BlockSize: blockSize, MaxBlocks: 256, LRUCapacity: blocks}
}

// gie is GIE's default endpoint picker: a prefix score from its own record of the prompts it
// sent to each worker (hashes of block-sized chunks of the prompt, chained, the trailing partial
// chunk included, held in an LRU per worker), plus the scraped queue and KV utilization.
type gie struct {
	cfg     GIEConfig
	rnd     *rand.Rand
	lru     []*hashLRU
	holders map[uint64]uint64 // block hash → bit set of the workers whose LRU holds it
	hashes  []uint64
	match   []int
	scores  []float64
	queue   []float64
}

func newGIE(cfg GIEConfig, workers int, rnd *rand.Rand) *gie {
	g := &gie{cfg: cfg, rnd: rnd, holders: make(map[uint64]uint64), match: make([]int, workers)}
	for i := range workers {
		g.lru = append(g.lru, newHashLRU(cfg.LRUCapacity, func(h uint64) { g.drop(h, i) }))
	}
	return g
}

func (g *gie) drop(h uint64, w int) {
	if s := g.holders[h] &^ (1 << w); s != 0 {
		g.holders[h] = s
	} else {
		delete(g.holders, h)
	}
}

// chunkHashes hashes prompt chunks of blockSize tokens, each chained onto the one before, the
// trailing partial chunk included, at most maxBlocks of them; a prompt shorter than one chunk
// has none (GIE's hashPrompt, over tokens where GIE hashes 4 characters per token).
func chunkHashes(dst []uint64, tokens []uint32, blockSize, maxBlocks int) []uint64 {
	if len(tokens) < blockSize {
		return dst
	}
	tokens = tokens[:min(len(tokens), blockSize*maxBlocks)]
	prev := uint64(14695981039346656037)
	for i := 0; i < len(tokens); i += blockSize {
		h := prev
		for _, t := range tokens[i:min(i+blockSize, len(tokens))] {
			h = (h ^ uint64(t)) * 1099511628211
		}
		h = (h ^ prev) * 1099511628211
		dst = append(dst, h)
		prev = h
	}
	return dst
}

func (g *gie) pick(tokens []uint32, load *peerLoad) int {
	g.hashes = chunkHashes(g.hashes[:0], tokens, g.cfg.BlockSize, g.cfg.MaxBlocks)
	clear(g.match)
	// Every worker holding a block counts it, walking until a block nobody holds.
	for _, h := range g.hashes {
		s := g.holders[h]
		if s == 0 {
			break
		}
		for w := range g.match {
			if s&(1<<w) != 0 {
				g.match[w]++
			}
		}
	}
	g.queue = queueScores(g.queue[:0], load.metrics)
	g.scores = gieScores(g.scores[:0], g.cfg, g.match, len(g.hashes), g.queue, load.metrics)
	w := maxScore(g.scores, g.rnd)
	g.record(g.hashes, w)
	return w
}

// record adds a routed prompt's block hashes to worker w's LRU (GIE's PreRequest).
func (g *gie) record(hashes []uint64, w int) {
	for _, h := range hashes {
		g.lru[w].add(h)
		g.holders[h] |= 1 << w
	}
}

// gieScores is the weighted sum of the three scorers per worker: prefix match/total blocks
// (0 without blocks), the queue score, and 1 − KV usage.
func gieScores(dst []float64, cfg GIEConfig, match []int, total int, queue []float64, m []Metrics) []float64 {
	for w := range match {
		prefix := 0.0
		if total > 0 {
			prefix = float64(match[w]) / float64(total)
		}
		dst = append(dst, cfg.PrefixWeight*prefix+cfg.QueueWeight*queue[w]+cfg.KVWeight*(1-m[w].KVUsage))
	}
	return dst
}

func (g *gie) events(int, []kvevent.Event) {}

// hashLRU is a bounded set of block hashes, least recently added evicted first (re-adding a
// held hash makes it the most recent), calling evict for each hash it lets go.
type hashLRU struct {
	cap   int
	order *list.List // front: most recent
	at    map[uint64]*list.Element
	evict func(uint64)
}

func newHashLRU(capacity int, evict func(uint64)) *hashLRU {
	return &hashLRU{cap: capacity, order: list.New(), at: make(map[uint64]*list.Element), evict: evict}
}

func (l *hashLRU) add(h uint64) {
	if e, ok := l.at[h]; ok {
		l.order.MoveToFront(e)
		return
	}
	l.at[h] = l.order.PushFront(h)
	if l.order.Len() > l.cap {
		e := l.order.Back()
		old := l.order.Remove(e).(uint64)
		delete(l.at, old)
		l.evict(old)
	}
}
