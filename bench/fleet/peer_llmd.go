package fleet

import (
	"math/rand/v2"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
)

// LLMDConfig is llm-d's scheduling profile with the precise prefix-cache scorer; a plain value.
type LLMDConfig struct {
	// Score weights of the profile llm-d ships for precise prefix-cache routing:
	// precise-prefix-cache-scorer 2, kv-cache-utilization-scorer 1, queue-scorer 1.
	PrefixWeight, KVWeight, QueueWeight float64
	// BlockSize is the index's block in tokens; it must match the engine's (--block-size).
	BlockSize int
}

// DefaultLLMDConfig is the profile of llm-d's precise-prefix-cache-aware guide for engines of
// blockSize tokens per block.
func DefaultLLMDConfig(blockSize int) LLMDConfig {
	return LLMDConfig{PrefixWeight: 2, KVWeight: 1, QueueWeight: 1, BlockSize: blockSize}
}

// llmd is llm-d's endpoint picker with its precise prefix-cache scorer: an index of the blocks
// each worker holds, kept from the workers' KV events (device tier), scored as the worker's
// longest cached prefix over the prompt's full blocks, plus the scraped KV utilization and
// queue. Speculative indexing (off by default) is not modelled.
type llmd struct {
	cfg    LLMDConfig
	rnd    *rand.Rand
	h      radix.Hasher
	held   map[uint64]uint64   // sequence hash → bit set of the workers holding the block
	engine []map[uint64]uint64 // per worker: engine hash → sequence hash
	seqs   []uint64
	locals []uint64
	match  []int
	scores []float64
	queue  []float64
}

func newLLMD(cfg LLMDConfig, workers int, rnd *rand.Rand) *llmd {
	l := &llmd{cfg: cfg, rnd: rnd, held: make(map[uint64]uint64), match: make([]int, workers)}
	for range workers {
		l.engine = append(l.engine, make(map[uint64]uint64))
	}
	return l
}

func (l *llmd) events(w int, evs []kvevent.Event) {
	bit := uint64(1) << w
	eng := l.engine[w]
	for i := range evs {
		e := &evs[i]
		if e.Tier != kvevent.Device {
			continue
		}
		switch e.Kind {
		case kvevent.Stored:
			parent, ok := uint64(0), false
			if e.HasParent {
				if parent, ok = eng[e.Parent]; !ok {
					continue // a parent never seen: the chain cannot be placed
				}
			}
			bs := e.BlockSize
			if bs == 0 {
				bs = l.cfg.BlockSize
			}
			l.locals = l.h.AppendLocal(l.locals[:0], e.Tokens, bs, radix.Seed("", ""))
			for j, loc := range l.locals {
				if j >= len(e.Hashes) {
					break
				}
				seq := loc
				if ok || j > 0 {
					seq = radix.SeqHash(parent, loc)
				}
				eng[e.Hashes[j]] = seq
				l.held[seq] |= bit
				parent, ok = seq, true
			}
		case kvevent.Removed:
			for _, eh := range e.Hashes {
				seq, ok := eng[eh]
				if !ok {
					continue
				}
				delete(eng, eh)
				if s := l.held[seq] &^ bit; s != 0 {
					l.held[seq] = s
				} else {
					delete(l.held, seq)
				}
			}
		case kvevent.Cleared:
			for eh, seq := range eng {
				if s := l.held[seq] &^ bit; s != 0 {
					l.held[seq] = s
				} else {
					delete(l.held, seq)
				}
				delete(eng, eh)
			}
		}
	}
}

func (l *llmd) pick(tokens []uint32, load *peerLoad) int {
	l.seqs = l.h.AppendSequence(l.seqs[:0], tokens, l.cfg.BlockSize, radix.Seed("", ""))
	clear(l.match)
	// Longest prefix: a worker scores the blocks it holds from the first one on, without a gap.
	active := uint64(1)<<len(l.match) - 1
	for _, s := range l.seqs {
		active &= l.held[s]
		if active == 0 {
			break
		}
		for w := range l.match {
			if active&(1<<w) != 0 {
				l.match[w]++
			}
		}
	}
	l.queue = queueScores(l.queue[:0], load.metrics)
	l.scores = llmdScores(l.scores[:0], l.cfg, l.match, len(l.seqs), l.queue, load.metrics)
	return maxScore(l.scores, l.rnd)
}

// llmdScores is the weighted sum of the three scorers per worker: cached prefix blocks over the
// prompt's full blocks (0 without any), 1 − KV usage, and the queue score.
func llmdScores(dst []float64, cfg LLMDConfig, match []int, total int, queue []float64, m []Metrics) []float64 {
	for w := range match {
		prefix := 0.0
		if total > 0 {
			prefix = min(1, float64(match[w])/float64(total))
		}
		dst = append(dst, cfg.PrefixWeight*prefix+cfg.KVWeight*(1-m[w].KVUsage)+cfg.QueueWeight*queue[w])
	}
	return dst
}
