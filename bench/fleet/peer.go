package fleet

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// Peer names the routing policy of another router that users run in front of inference
// workers, simulated so that kvrouterd's kv mode can be compared with it on the same fleet
// (Config.Peer). docs/peers.md gives each policy's rules, defaults and sources.
type Peer string

const (
	// LLMD is llm-d's inference scheduler with its precise-prefix-cache scorer (an index fed by
	// the workers' KV events) weighted 2, and its kv-cache-utilization and queue scorers weighted
	// 1 each, max-score picker.
	LLMD Peer = "llmd"
	// SGLang is SGLang's router (sgl-model-gateway) with its cache_aware policy: an approximate
	// radix tree per worker of the requests it sent there, and its balance thresholds over the
	// requests it has in flight per worker.
	SGLang Peer = "sglang"
	// GIE is the Gateway API inference extension's endpoint picker with its default profile:
	// its approximate prefix-cache scorer weighted 3, queue scorer 2, kv-cache-utilization
	// scorer 2, max-score picker.
	GIE Peer = "gie"
)

// Peers are the simulated peers, in the order reports show them.
var Peers = []Peer{LLMD, SGLang, GIE}

// ParsePeer returns the peer named s (case-insensitive), or false.
func ParsePeer(s string) (Peer, bool) {
	for _, p := range Peers {
		if strings.EqualFold(s, string(p)) {
			return p, true
		}
	}
	return "", false
}

// DefaultScrapeInterval is how often the endpoint pickers of GIE and llm-d refresh the metrics
// they score on (their --refresh-metrics-interval, 50 ms).
const DefaultScrapeInterval = 50 * time.Millisecond

// Metrics is one worker's load as a router scrapes it from the engine's metrics endpoint: the
// requests waiting for admission (vLLM's num_requests_waiting) and the fraction of KV blocks
// held by running requests (vLLM's kv_cache_usage_perc, where cached blocks no request uses
// count as free).
type Metrics struct {
	Waiting int
	KVUsage float64
}

// peerLoad is what a peer's policy knows of the workers' load when it picks: the metrics of the
// last scrape, and the requests the router itself has in flight per worker.
type peerLoad struct {
	now      int64 // simulated ns
	metrics  []Metrics
	inflight []int
}

// peerPolicy is one peer's routing rule over the state it keeps. Not safe for concurrent use:
// Run calls it from its one goroutine.
type peerPolicy interface {
	// pick chooses a worker (0-based) for a prompt and records the decision where the peer
	// does (its approximate cache).
	pick(tokens []uint32, load *peerLoad) int
	// events applies one batch of KV events of worker w (0-based); peers without an
	// event-fed index ignore them.
	events(w int, evs []kvevent.Event)
}

// peerRouter is a Router that routes by a peer's policy over the simulated workers, reading
// their metrics as a scrape every interval would: a route sees the metrics read at the first
// route of the current interval, so requests arriving together see the same, stale, load.
type peerRouter struct {
	policy   peerPolicy
	ws       []*worker // set by Run once the workers exist
	now      *int64
	interval int64
	tick     int64 // the interval of the last scrape; -1: none yet
	load     peerLoad
	routed   map[string]int // request id → worker index, for the in-flight counts
}

func newPeerRouter(cfg Config, blockSize int, now *int64) (*peerRouter, error) {
	rnd := rand.New(rand.NewPCG(cfg.Seed, 0x70656572))
	blocks := cfg.Worker.Blocks
	if blocks <= 0 {
		blocks = sim.DefaultWorkerConfig().Blocks // what sim.NewWorker takes for 0
	}
	var p peerPolicy
	switch cfg.Peer {
	case LLMD:
		p = newLLMD(DefaultLLMDConfig(blockSize), cfg.Workers, rnd)
	case SGLang:
		p = newSGLang(DefaultSGLangConfig(), cfg.Workers)
	case GIE:
		p = newGIE(DefaultGIEConfig(blockSize, blocks), cfg.Workers, rnd)
	default:
		return nil, fmt.Errorf("fleet: unknown peer %q", cfg.Peer)
	}
	iv := cfg.ScrapeInterval
	if iv <= 0 {
		iv = DefaultScrapeInterval
	}
	return &peerRouter{policy: p, now: now, interval: int64(iv), tick: -1,
		load:   peerLoad{metrics: make([]Metrics, cfg.Workers), inflight: make([]int, cfg.Workers)},
		routed: make(map[string]int)}, nil
}

func (p *peerRouter) Register(g router.Registration) error {
	if g.ID < 1 || g.ID > uint64(len(p.load.inflight)) {
		return fmt.Errorf("fleet: peer router: worker %d out of range", g.ID)
	}
	return nil
}

// scrape refreshes the metrics once per interval.
func (p *peerRouter) scrape() {
	t := *p.now / p.interval
	if t == p.tick {
		return
	}
	p.tick = t
	for i, w := range p.ws {
		p.load.metrics[i] = Metrics{Waiting: w.w.Waiting(), KVUsage: w.w.ActiveUsage()}
	}
}

func (p *peerRouter) Route(req *wire.RouteRequest, resp *wire.RouteResponse) error {
	p.scrape()
	p.load.now = *p.now
	w := p.policy.pick(req.Tokens, &p.load)
	p.load.inflight[w]++
	p.routed[req.RequestID] = w
	*resp = wire.RouteResponse{Worker: uint64(w + 1)}
	return nil
}

func (p *peerRouter) Events(b *wire.EventBatch) error {
	p.policy.events(int(b.Worker-1), b.Events)
	return nil
}

func (p *peerRouter) PrefillDone(string) error { return nil }

func (p *peerRouter) Complete(id string) error {
	w, ok := p.routed[id]
	if !ok {
		return fmt.Errorf("fleet: peer router: request %s not in flight", id)
	}
	delete(p.routed, id)
	p.load.inflight[w]--
	return nil
}

// queueScores are the queue scorer's scores of GIE and llm-d: (max − waiting) / (max − min)
// over the candidates, 1 for all when every queue is as long.
func queueScores(dst []float64, m []Metrics) []float64 {
	lo, hi := m[0].Waiting, m[0].Waiting
	for _, x := range m {
		lo, hi = min(lo, x.Waiting), max(hi, x.Waiting)
	}
	for _, x := range m {
		s := 1.0
		if hi > lo {
			s = float64(hi-x.Waiting) / float64(hi-lo)
		}
		dst = append(dst, s)
	}
	return dst
}

// maxScore is the max-score picker: the highest score, ties broken at random (the picker
// shuffles the candidates before a stable sort).
func maxScore(scores []float64, rnd *rand.Rand) int {
	best, n := 0, 0
	for i, s := range scores {
		switch {
		case i == 0 || s > scores[best]:
			best, n = i, 1
		case s == scores[best]:
			n++
			if rnd.IntN(n) == 0 { // reservoir: each tie equally likely
				best = i
			}
		}
	}
	return best
}
