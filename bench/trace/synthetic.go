package trace

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"time"
)

// SyntheticConfig describes a shared-prefix workload. Plain data; DefaultSynthetic is a sensible
// start. Each arrival is one of three kinds:
//
//   - a document request (when FanOut > 0, with probability DocShare, or always when Sessions
//     is 0): system prompt, then the current document of DocTokens, then a fresh question;
//     every FanOut of them a new document starts;
//   - a session turn (otherwise, when Sessions > 0): one of Sessions open conversations, picked
//     uniformly, sends its next turn, whose prompt is its previous prompt, the previous answer
//     (Output tokens) and about TurnTokens new tokens; a conversation that has sent
//     TurnsPerSession turns is replaced by a new one with a new Session id;
//   - a single request (when there are neither): system prompt and a fresh question.
//
// Every conversation and document starts with one of SystemPrompts system prompts of
// SystemTokens each, picked uniformly. Question, turn and output lengths are uniform in
// [½, 1½] × their mean.
type SyntheticConfig struct {
	Seed            uint64
	Duration        time.Duration // arrivals in [0, Duration)
	Rate            float64       // mean arrivals per second (Poisson)
	SystemPrompts   int           // distinct system prompts; 0 = prompts start without one
	SystemTokens    int           // tokens per system prompt
	Sessions        int           // conversations open at once
	TurnsPerSession int           // turns per conversation; ≤ 0 → 1
	TurnTokens      int           // mean new user tokens per turn or question (at least 1)
	FanOut          int           // requests per document; 0 = no document requests
	DocTokens       int           // tokens per document
	DocShare        float64       // fraction of arrivals that are document requests; 0 → 0.2
	Output          int           // mean output tokens (at least 1)
	Vocab           uint32        // token ids are in [0, Vocab); 0 → DefaultVocab
}

// DefaultSynthetic is a ten-minute workload of about 2,400 requests at 4 per second: 4 system
// prompts of 1,024 tokens, 64 open conversations of 6 turns (256 new tokens and a 256-token
// answer per turn), and a fifth of the arrivals in fan-outs of 8 over 4,096-token documents.
func DefaultSynthetic() SyntheticConfig {
	return SyntheticConfig{
		Seed:            1,
		Duration:        10 * time.Minute,
		Rate:            4,
		SystemPrompts:   4,
		SystemTokens:    1024,
		Sessions:        64,
		TurnsPerSession: 6,
		TurnTokens:      256,
		FanOut:          8,
		DocTokens:       4096,
		DocShare:        0.2,
		Output:          256,
		Vocab:           DefaultVocab,
	}
}

// synth is the state of one Synthetic run.
type synth struct {
	cfg   SyntheticConfig
	rng   *rand.Rand
	vocab uint64
	key   uint64 // next token stream; every fresh run of tokens gets its own
	sys   [][]uint32
}

// fresh appends n tokens no other part of the workload has.
func (g *synth) fresh(dst []uint32, n int) []uint32 {
	start := len(dst)
	dst = append(dst, make([]uint32, n)...)
	fillTokens(dst[start:], g.key, g.vocab)
	g.key++
	return dst
}

// around returns a length uniform in [mean/2, 3·mean/2], at least 1.
func (g *synth) around(mean int) int {
	mean = max(mean, 1)
	return max(1, mean/2+g.rng.IntN(mean+1))
}

func (g *synth) system() []uint32 {
	if len(g.sys) == 0 {
		return nil
	}
	return g.sys[g.rng.IntN(len(g.sys))]
}

// session is one open conversation. Its prompts are prefixes of buf, which only grows, so all
// its turns share one array (until append moves it).
type session struct {
	id     uint64
	buf    []uint32
	turns  int
	answer int // output tokens of the previous turn, appended before the next question
}

// Synthetic generates a shared-prefix workload without any trace file (see SyntheticConfig),
// sorted by At. It is deterministic for cfg: equal configs give equal workloads.
func Synthetic(cfg SyntheticConfig) []Request {
	return Collect(SyntheticSource(cfg))
}

// SyntheticSource generates the workload Synthetic returns one request at a time, holding only
// the open sessions, the system prompts and the current document: a workload of any length in
// bounded memory (Duration sets its length; Rate × Duration requests on average).
func SyntheticSource(cfg SyntheticConfig) Source {
	g := &synthSource{synth: synth{
		cfg:   cfg,
		rng:   rand.New(rand.NewPCG(cfg.Seed, 0x73796e7468)),
		vocab: DefaultVocab,
		key:   mix64(cfg.Seed ^ 0x73796e7468657469),
	}}
	if !(cfg.Rate > 0) || cfg.Duration <= 0 {
		g.done = true
		return g
	}
	if g.cfg.DocShare == 0 {
		g.cfg.DocShare = 0.2
	}
	if cfg.Vocab != 0 {
		g.vocab = uint64(cfg.Vocab)
	}
	for range cfg.SystemPrompts {
		g.sys = append(g.sys, g.fresh(nil, cfg.SystemTokens))
	}
	g.turns = max(cfg.TurnsPerSession, 1)
	g.nextID = 1
	g.open = make([]*session, cfg.Sessions)
	for i := range g.open {
		g.open[i] = g.newSession()
	}
	return g
}

// synthSource is SyntheticSource's state between requests.
type synthSource struct {
	synth
	turns   int
	nextID  uint64
	open    []*session
	doc     []uint32 // system prompt and the current document
	docLeft int
	at      time.Duration
	done    bool
}

func (g *synthSource) newSession() *session {
	s := &session{id: g.nextID}
	g.nextID++
	s.buf = append(s.buf, g.system()...)
	return s
}

func (g *synthSource) Err() error { return nil }

func (g *synthSource) Next() (Request, bool) {
	if g.done {
		return Request{}, false
	}
	cfg := &g.cfg
	g.at += time.Duration(g.rng.ExpFloat64() / cfg.Rate * float64(time.Second))
	if g.at >= cfg.Duration {
		g.done = true
		return Request{}, false
	}
	out := g.around(cfg.Output)
	switch {
	case cfg.FanOut > 0 && (cfg.Sessions == 0 || g.rng.Float64() < cfg.DocShare):
		if g.docLeft == 0 {
			g.doc = g.fresh(append([]uint32(nil), g.system()...), cfg.DocTokens)
			g.docLeft = cfg.FanOut
		}
		g.docLeft--
		toks := make([]uint32, len(g.doc), len(g.doc)+cfg.TurnTokens*3/2+1)
		copy(toks, g.doc)
		toks = g.fresh(toks, g.around(cfg.TurnTokens))
		return Request{At: g.at, Tokens: toks[:len(toks):len(toks)], Output: out}, true
	case cfg.Sessions > 0:
		i := g.rng.IntN(len(g.open))
		s := g.open[i]
		s.buf = g.fresh(s.buf, s.answer)
		s.buf = g.fresh(s.buf, g.around(cfg.TurnTokens))
		s.answer = out
		s.turns++
		n := len(s.buf)
		if s.turns == g.turns {
			g.open[i] = g.newSession()
		}
		return Request{At: g.at, Tokens: s.buf[:n:n], Output: out, Session: s.id}, true
	default:
		toks := g.fresh(append([]uint32(nil), g.system()...), g.around(cfg.TurnTokens))
		return Request{At: g.at, Tokens: toks, Output: out}, true
	}
}

// BurstConfig describes a burst workload: groups of sibling requests that share a long prefix
// (one agent's parallel calls over one context, a fan-out over one document) and arrive within
// Spread of each other, a window shorter than the time a worker takes to prefill the prefix
// and the router to hear of its blocks. Plain data; DefaultBurst is the report's.
type BurstConfig struct {
	Seed     uint64
	Duration time.Duration // groups start in [0, Duration)
	Rate     float64       // mean groups per second (Poisson)
	Size     int           // requests per group (at least 1)
	Prefix   int           // tokens of the group's shared prefix, fresh for every group
	Suffix   int           // mean tokens each sibling adds after it (uniform in [½, 1½] × Suffix)
	Spread   time.Duration // siblings arrive uniformly within this window after the group's start
	Output   int           // mean output tokens (at least 1)
	Vocab    uint32        // token ids are in [0, Vocab); 0 → DefaultVocab
}

// DefaultBurst is ten minutes of groups of 8 siblings over a fresh 4,096-token prefix, one group
// every 2 s on average (2,400 requests), the siblings arriving within 20 ms with 128 tokens of
// their own and 128-token answers.
func DefaultBurst() BurstConfig {
	return BurstConfig{Seed: 1, Duration: 10 * time.Minute, Rate: 0.5, Size: 8, Prefix: 4096, Suffix: 128,
		Spread: 20 * time.Millisecond, Output: 128, Vocab: DefaultVocab}
}

// Burst generates a burst workload (see BurstConfig), sorted by At. It is deterministic for
// cfg. Siblings of one group share exactly their Prefix tokens; no two groups share any.
func Burst(cfg BurstConfig) []Request {
	if !(cfg.Rate > 0) || cfg.Duration <= 0 {
		return nil
	}
	g := &synth{rng: rand.New(rand.NewPCG(cfg.Seed, 0x6275727374)), vocab: DefaultVocab, key: mix64(cfg.Seed ^ 0x6275727374)}
	if cfg.Vocab != 0 {
		g.vocab = uint64(cfg.Vocab)
	}
	var reqs []Request
	at := time.Duration(0)
	for {
		at += time.Duration(g.rng.ExpFloat64() / cfg.Rate * float64(time.Second))
		if at >= cfg.Duration {
			break
		}
		prefix := g.fresh(nil, cfg.Prefix)
		for range max(cfg.Size, 1) {
			toks := make([]uint32, len(prefix), len(prefix)+cfg.Suffix*3/2+1)
			copy(toks, prefix)
			toks = g.fresh(toks, g.around(cfg.Suffix))
			off := time.Duration(0)
			if cfg.Spread > 0 {
				off = time.Duration(g.rng.Int64N(int64(cfg.Spread)))
			}
			reqs = append(reqs, Request{At: at + off, Tokens: toks[:len(toks):len(toks)], Output: g.around(cfg.Output)})
		}
	}
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmp.Compare(a.At, b.At) })
	return reqs
}
