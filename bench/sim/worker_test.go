package sim

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
)

func TestTiming(t *testing.T) {
	tm := DefaultTiming()
	f := func(prefill int, u float64, decoding bool, wantMs float64) {
		t.Helper()
		want := time.Duration(wantMs*1e6 + 0.5)
		if got := tm.StepTime(prefill, u, decoding); got != want {
			t.Errorf("StepTime(%d, %v, %v) = %v, want %v", prefill, u, decoding, got, want)
		}
	}
	// 4.209989e-7·1000² + 1.518344e-2·1000 + 16.50142 = 0.4209989 + 15.18344 + 16.50142
	f(1000, 0, false, 32.1058589)
	// 4.209989e-7·8192² + 1.518344e-2·8192 + 16.50142 = 28.2527… + 124.3827… + 16.50142
	f(8192, 0.9, false, 169.1369184042496)
	f(1, 0, false, 16.5166038609989)
	f(0, 0, false, 0)
	f(0, 0, true, 5.74)                  // u = 0: D0
	f(0, 0.5, true, 26.31)               // −25.74·0.25 + 54.01·0.5 + 5.74
	f(0, 1, true, 34.01)                 // −25.74 + 54.01 + 5.74
	f(0, 0.07, true, 9.394574)           // −25.74·0.0049 + 54.01·0.07 + 5.74
	f(1000, 0.5, true, 32.1058589+26.31) // a mixed step pays both parts
	f(100, 0.07, true, 18.023973989+9.394574)

	// The floor applies when the polynomial drops below it.
	low := Timing{P0: 1, D0: -3, D1: 1, DecodeFloor: 1}
	if got := low.StepTime(0, 0.5, true); got != time.Millisecond {
		t.Errorf("floored decode = %v, want 1ms", got)
	}
	if got := (Timing{P0: -5}).StepTime(10, 0, false); got != 0 {
		t.Errorf("negative prefill = %v, want 0", got)
	}
}

func toks(start, n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(start + i)
	}
	return s
}

func seqHashes(tokens []uint32, bs int) []uint64 {
	var h radix.Hasher
	return h.AppendSequence(nil, tokens, bs, radix.LoRASeed(""))
}

// run steps w until it is idle, returning the outputs of every step (deep-copied).
func drain(t *testing.T, w *Worker, now int64) (int64, []StepOutput) {
	t.Helper()
	var outs []StepOutput
	var out StepOutput
	for !w.Idle() {
		now = w.Step(now, &out)
		if err := w.check(); err != nil {
			t.Fatal(err)
		}
		outs = append(outs, cloneOut(&out))
	}
	return now, outs
}

func cloneOut(o *StepOutput) StepOutput {
	c := StepOutput{
		PrefillDone:   slices.Clone(o.PrefillDone),
		Completed:     slices.Clone(o.Completed),
		PrefillTokens: o.PrefillTokens,
		DecodeTokens:  o.DecodeTokens,
	}
	for _, ev := range o.Events {
		ev.Hashes = slices.Clone(ev.Hashes)
		ev.Tokens = slices.Clone(ev.Tokens)
		ev.Locals = slices.Clone(ev.Locals)
		c.Events = append(c.Events, ev)
	}
	return c
}

func TestSingleRequestTiming(t *testing.T) {
	w := NewWorker(1, WorkerConfig{Blocks: 100, BlockSize: 16})
	if err := w.Submit(&Request{ID: 7, Tokens: toks(0, 100), Output: 3}, 0); err != nil {
		t.Fatal(err)
	}
	end, outs := drain(t, w, 0)
	if len(outs) != 3 {
		t.Fatalf("%d steps, want 3 (prefill + first token, then two decode steps)", len(outs))
	}
	// Step 1: prefill of 100 tokens (18.023973989 ms) plus the first token's decode at
	// u = 7 blocks / 100 (9.394574 ms). Steps 2 and 3 decode at the same usage.
	first := int64(27418548)
	if got := outs[0].PrefillDone; len(got) != 1 || got[0] != (Done{ID: 7, At: first}) {
		t.Errorf("PrefillDone = %+v", got)
	}
	if want := first + 2*9394574; end != want || outs[2].Completed[0].At != want {
		t.Errorf("end %d, completed %+v, want %d", end, outs[2].Completed, want)
	}
	// The step time split: 27,418,548 − 9,394,574 ns of prefill, three decode parts.
	if st := w.Stats(); st.PrefillNs != 18023974 || st.DecodeNs != 3*9394574 {
		t.Errorf("prefill %d ns, decode %d ns", st.PrefillNs, st.DecodeNs)
	}
	if outs[0].PrefillTokens != 100 || outs[1].DecodeTokens != 1 || outs[2].DecodeTokens != 1 {
		t.Errorf("tokens per step: %+v", outs)
	}
	// Six full prompt blocks were stored in one chained event; the tail stays private.
	ev := outs[0].Events
	if len(ev) != 1 || ev[0].Kind != kvevent.Stored || ev[0].ID != 1 || ev[0].HasParent ||
		!slices.Equal(ev[0].Hashes, seqHashes(toks(0, 100), 16)) || ev[0].BlockSize != 16 ||
		!slices.Equal(ev[0].Tokens, toks(0, 96)) {
		t.Errorf("events %+v", ev)
	}
	if w.CachedBlocks() != 6 || w.Usage() != 0.06 || w.ActiveUsage() != 0 {
		t.Errorf("cached %d, usage %v, active %v", w.CachedBlocks(), w.Usage(), w.ActiveUsage())
	}
	// Idle: nothing happens.
	var out StepOutput
	if got := w.Step(end+5, &out); got != end+5 || len(out.Events) != 0 {
		t.Errorf("idle step returned %d, %d events", got, len(out.Events))
	}
}

func TestEvictionLRUAndPrefixHits(t *testing.T) {
	const bs = 4
	w := NewWorker(1, WorkerConfig{Blocks: 8, BlockSize: bs})
	A := seqHashes(toks(0, 16), bs)
	B := seqHashes(toks(100, 16), bs)
	cTok := append(toks(0, 8), toks(200, 8)...)
	C := seqHashes(cTok, bs)
	dTok := append(toks(0, 4), toks(300, 12)...)
	D := seqHashes(dTok, bs)
	eTok := toks(400, 16)

	var removed []uint64
	var now int64
	submit := func(id uint64, tokens []uint32, output int) {
		t.Helper()
		if err := w.Submit(&Request{ID: id, Tokens: tokens, Output: output}, now); err != nil {
			t.Fatal(err)
		}
	}
	collect := func(outs []StepOutput) {
		for _, o := range outs {
			for _, ev := range o.Events {
				if ev.Kind == kvevent.Removed {
					removed = append(removed, ev.Hashes...)
				}
			}
		}
	}

	submit(1, toks(0, 16), 1)
	now, outs := drain(t, w, now)
	collect(outs)
	submit(2, toks(100, 16), 1)
	now, outs = drain(t, w, now)
	collect(outs)
	if w.CachedBlocks() != 8 || w.Usage() != 1 || len(removed) != 0 {
		t.Fatalf("after A, B: cached %d, usage %v, removed %d", w.CachedBlocks(), w.Usage(), len(removed))
	}

	// C shares A's first two blocks: it pins them and evicts the two least recently used
	// blocks, A's tail (released tail first, so A3 goes before A2).
	submit(3, cTok, 1)
	now, outs = drain(t, w, now)
	collect(outs)
	if got := outs[0].PrefillDone; len(got) != 1 || got[0].Cached != 8 {
		t.Errorf("C PrefillDone %+v, want 8 cached tokens", got)
	}
	if got := outs[0].Completed; len(got) != 1 || got[0].Cached != 8 {
		t.Errorf("C Completed %+v", got)
	}
	ev := outs[0].Events
	if len(ev) != 2 || ev[0].Kind != kvevent.Removed || !slices.Equal(ev[0].Hashes, []uint64{A[3], A[2]}) ||
		ev[1].Kind != kvevent.Stored || !ev[1].HasParent || ev[1].Parent != A[1] ||
		!slices.Equal(ev[1].Hashes, C[2:]) {
		t.Errorf("C events %+v", ev)
	}

	// D pins A0 and runs for a while; E cannot be admitted until D is done. D's decode blocks
	// evict B, then C3; A0 (pinned) and D's blocks never go.
	submit(4, dTok, 9)
	submit(5, eTok, 1)
	var out StepOutput
	now = w.Step(now, &out)
	if w.Running() != 1 || w.Waiting() != 1 || out.PrefillDone[0].Cached != 4 {
		t.Fatalf("running %d waiting %d, done %+v", w.Running(), w.Waiting(), out.PrefillDone)
	}
	collect([]StepOutput{cloneOut(&out)})
	for w.Running() == 1 && w.Waiting() == 1 {
		now = w.Step(now, &out)
		collect([]StepOutput{cloneOut(&out)})
		if err := w.check(); err != nil {
			t.Fatal(err)
		}
	}
	_, outs = drain(t, w, now)
	collect(outs)
	want := []uint64{A[3], A[2], B[3], B[2], B[1], B[0], C[3], C[2], C[1]}
	if !slices.Equal(removed, want) {
		t.Errorf("eviction order\n got %x\nwant %x", removed, want)
	}
	for _, h := range []uint64{A[0], D[1], D[2], D[3]} {
		if _, ok := w.byHash[h]; !ok {
			t.Errorf("block %x evicted", h)
		}
	}
}

func TestFullyCachedPrompt(t *testing.T) {
	w := NewWorker(1, WorkerConfig{Blocks: 16, BlockSize: 4})
	w.Submit(&Request{ID: 1, Tokens: toks(0, 8), Output: 1}, 0)
	now, _ := drain(t, w, 0)
	// The same prompt again: its last token is recomputed, so only the first block is a hit;
	// the recomputed second block is already cached and is not stored again.
	w.Submit(&Request{ID: 2, Tokens: toks(0, 8), Output: 3}, now)
	_, outs := drain(t, w, now)
	if d := outs[0].PrefillDone; len(d) != 1 || d[0].Cached != 4 || outs[0].PrefillTokens != 4 {
		t.Errorf("PrefillDone %+v, %d prefill tokens", d, outs[0].PrefillTokens)
	}
	for _, o := range outs {
		if len(o.Events) != 0 {
			t.Errorf("events %+v", o.Events)
		}
	}
	if w.CachedBlocks() != 2 || w.Usage() != 2.0/16 {
		t.Errorf("cached %d, usage %v", w.CachedBlocks(), w.Usage())
	}
}

func TestSubmitRefuses(t *testing.T) {
	w := NewWorker(1, WorkerConfig{Blocks: 4, BlockSize: 4})
	if err := w.Submit(&Request{ID: 1}, 0); !errors.Is(err, ErrEmptyPrompt) {
		t.Errorf("empty prompt: %v", err)
	}
	if err := w.Submit(&Request{ID: 2, Tokens: toks(0, 16), Output: 2}, 0); !errors.Is(err, ErrTooLarge) {
		t.Errorf("17 tokens of KV in 16: %v", err)
	}
	if err := w.Submit(&Request{ID: 3, Tokens: toks(0, 16), Output: 1}, 0); err != nil {
		t.Errorf("16 tokens of KV in 16: %v", err)
	}
	if w.Waiting() != 1 {
		t.Errorf("waiting %d", w.Waiting())
	}
}

func TestLimits(t *testing.T) {
	w := NewWorker(1, WorkerConfig{Blocks: 1000, BlockSize: 4, MaxSeqs: 2})
	for i := range 5 {
		w.Submit(&Request{ID: uint64(i), Tokens: toks(i*100, 10), Output: 5}, 0)
	}
	var out StepOutput
	w.Step(0, &out)
	if w.Running() != 2 || w.Waiting() != 3 {
		t.Errorf("MaxSeqs 2: running %d, waiting %d", w.Running(), w.Waiting())
	}

	w = NewWorker(1, WorkerConfig{Blocks: 1000, BlockSize: 4, MaxBatchedTokens: 16})
	for i := range 3 {
		w.Submit(&Request{ID: uint64(i), Tokens: toks(i*100, 10), Output: 5}, 0)
	}
	now := w.Step(0, &out)
	if out.PrefillTokens != 16 || w.Running() != 2 || w.Waiting() != 1 || len(out.PrefillDone) != 1 {
		t.Errorf("step 1: %d prefill tokens, running %d, waiting %d, %+v", out.PrefillTokens, w.Running(), w.Waiting(), out.PrefillDone)
	}
	// Step 2: request 0 decodes (1), request 1 finishes its prompt (4), request 2 gets 10.
	w.Step(now, &out)
	if out.DecodeTokens != 1 || out.PrefillTokens != 14 || w.Running() != 3 || len(out.PrefillDone) != 2 {
		t.Errorf("step 2: %d decode, %d prefill, running %d", out.DecodeTokens, out.PrefillTokens, w.Running())
	}
}

func TestChunkedPrefill(t *testing.T) {
	w := NewWorker(1, WorkerConfig{})
	w.Submit(&Request{ID: 1, Tokens: toks(0, 20000), Output: 1}, 0)
	_, outs := drain(t, w, 0)
	if len(outs) != 3 {
		t.Fatalf("%d steps, want 3", len(outs))
	}
	tm := DefaultTiming()
	var now int64
	for i, want := range []int{8192, 8192, 3616} {
		o := outs[i]
		if o.PrefillTokens != want || (len(o.PrefillDone) == 1) != (i == 2) {
			t.Errorf("step %d: %d prefill tokens, done %+v", i, o.PrefillTokens, o.PrefillDone)
		}
		// Chunks that finish no prompt cost the prefill part only: 169.1369184042496 ms.
		d := tm.StepTime(want, 313.0/16384, i == 2)
		if i < 2 && d != 169136918 {
			t.Errorf("chunk time %v", d)
		}
		now += int64(d)
	}
	if got := outs[2].Completed[0].At; got != now {
		t.Errorf("completed at %d, want %d", got, now)
	}
	var stored int
	for _, o := range outs {
		for _, ev := range o.Events {
			stored += len(ev.Hashes)
		}
	}
	if stored != 20000/64 {
		t.Errorf("%d blocks stored, want %d", stored, 20000/64)
	}

	// A decoding sequence takes its token first; the long prompt gets the rest of the budget.
	w = NewWorker(1, WorkerConfig{})
	w.Submit(&Request{ID: 1, Tokens: toks(0, 100), Output: 50}, 0)
	var out StepOutput
	now = w.Step(0, &out)
	w.Submit(&Request{ID: 2, Tokens: toks(1000, 20000), Output: 2}, now)
	for i, want := range []int{8191, 8191, 3618} {
		now = w.Step(now, &out)
		if out.PrefillTokens != want || out.DecodeTokens != 1 || (len(out.PrefillDone) == 1) != (i == 2) {
			t.Errorf("mixed step %d: prefill %d, decode %d, done %+v", i, out.PrefillTokens, out.DecodeTokens, out.PrefillDone)
		}
	}
}

// model is the router's view of one worker, built from its events alone.
type model struct {
	t        *testing.T
	bs       int
	nextID   uint64
	parent   map[uint64]uint64 // cached block → parent (0 at the root)
	children map[uint64]int
	host     map[uint64]bool // blocks in the host tier
	hasher   radix.Hasher
	buf      []uint64
}

func newModel(t *testing.T, bs int) *model {
	return &model{t: t, bs: bs, parent: map[uint64]uint64{}, children: map[uint64]int{}, host: map[uint64]bool{}}
}

func (m *model) apply(evs []kvevent.Event) {
	t := m.t
	t.Helper()
	for _, ev := range evs {
		m.nextID++
		if ev.ID != m.nextID {
			t.Fatalf("event id %d, want %d", ev.ID, m.nextID)
		}
		if ev.Tier == kvevent.Host {
			m.applyHost(ev)
			continue
		}
		if ev.Tier != kvevent.Device {
			t.Fatalf("event %d of tier %v", ev.ID, ev.Tier)
		}
		switch ev.Kind {
		case kvevent.Stored:
			if ev.BlockSize != m.bs || len(ev.Tokens) != len(ev.Hashes)*m.bs || len(ev.Hashes) == 0 {
				t.Fatalf("stored event %d: block size %d, %d tokens for %d blocks", ev.ID, ev.BlockSize, len(ev.Tokens), len(ev.Hashes))
			}
			// The router re-hashes the tokens: it must land on the engine hashes.
			m.buf = m.hasher.AppendLocal(m.buf[:0], ev.Tokens, m.bs, radix.LoRASeed(""))
			radix.ChainInPlace(m.buf, ev.Parent, ev.HasParent)
			if !slices.Equal(m.buf, ev.Hashes) {
				t.Fatalf("stored event %d: hashes are not the sequence hashes of its tokens", ev.ID)
			}
			p, hasP := ev.Parent, ev.HasParent
			for _, h := range ev.Hashes {
				if hasP {
					if _, ok := m.parent[p]; !ok {
						t.Fatalf("stored event %d: parent %x not cached", ev.ID, p)
					}
					m.children[p]++
				} else {
					p = 0
				}
				if _, ok := m.parent[h]; ok {
					t.Fatalf("stored event %d: block %x stored twice", ev.ID, h)
				}
				m.parent[h] = p
				p, hasP = h, true
			}
		case kvevent.Removed:
			for _, h := range ev.Hashes {
				p, ok := m.parent[h]
				if !ok {
					t.Fatalf("removed event %d: block %x not cached", ev.ID, h)
				}
				if m.children[h] != 0 {
					t.Fatalf("removed event %d: block %x still has %d cached children", ev.ID, h, m.children[h])
				}
				delete(m.parent, h)
				delete(m.children, h)
				if p != 0 {
					m.children[p]--
				}
			}
		default:
			t.Fatalf("unexpected event %v", ev.Kind)
		}
	}
}

// applyHost applies a host-tier event: a Stored one carries local hashes that chain from its
// parent to its engine hashes, and its parent is a block the router knows (on the device or in
// the host tier), so that it can be indexed; a Removed one names a block of the tier.
func (m *model) applyHost(ev kvevent.Event) {
	t := m.t
	t.Helper()
	switch ev.Kind {
	case kvevent.Stored:
		if ev.BlockSize != m.bs || len(ev.Tokens) != 0 || len(ev.Locals) != len(ev.Hashes) || len(ev.Hashes) == 0 {
			t.Fatalf("host stored event %d: block size %d, %d tokens, %d locals for %d blocks", ev.ID, ev.BlockSize,
				len(ev.Tokens), len(ev.Locals), len(ev.Hashes))
		}
		m.buf = append(m.buf[:0], ev.Locals...)
		radix.ChainInPlace(m.buf, ev.Parent, ev.HasParent)
		if !slices.Equal(m.buf, ev.Hashes) {
			t.Fatalf("host stored event %d: hashes are not the chain of its locals", ev.ID)
		}
		if _, onDevice := m.parent[ev.Parent]; ev.HasParent && !onDevice && !m.host[ev.Parent] {
			t.Fatalf("host stored event %d: parent %x in no tier", ev.ID, ev.Parent)
		}
		for _, h := range ev.Hashes {
			if m.host[h] {
				t.Fatalf("host stored event %d: block %x stored twice", ev.ID, h)
			}
			if _, ok := m.parent[h]; !ok {
				t.Fatalf("host stored event %d: block %x was not on the device", ev.ID, h)
			}
			m.host[h] = true
		}
	case kvevent.Removed:
		for _, h := range ev.Hashes {
			if !m.host[h] {
				t.Fatalf("host removed event %d: block %x not in the tier", ev.ID, h)
			}
			delete(m.host, h)
		}
	default:
		t.Fatalf("unexpected host event %v", ev.Kind)
	}
}

type workload struct {
	cfg      WorkerConfig
	requests int
	seed     uint64
	abort    int // when > 0, after each step one request in abort is aborted (none when 0)
}

// simulate runs a random workload with shared prefixes through one worker, checking the event
// stream against the reference model and the worker's invariants after every step. It returns
// a digest of everything the worker reported.
func simulate(t *testing.T, wl workload) uint64 {
	t.Helper()
	rng := rand.New(rand.NewPCG(wl.seed, 42))
	w := NewWorker(3, wl.cfg)
	cfg := w.Config()
	m := newModel(t, cfg.BlockSize)
	digest := fnv.New64a()
	put := func(xs ...uint64) {
		for _, x := range xs {
			var b [8]byte
			for i := range b {
				b[i] = byte(x >> (8 * i))
			}
			digest.Write(b[:])
		}
	}

	prefixes := make([][]uint32, 12)
	for i := range prefixes {
		prefixes[i] = toks(rng.IntN(1<<20), rng.IntN(8*cfg.BlockSize))
	}
	type pending struct {
		prompt, output, emitted int
		prefill                 bool
	}
	accepted := map[uint64]*pending{}
	var next int64
	var out StepOutput
	submitted := 0
	for submitted < wl.requests || !w.Idle() {
		for submitted < wl.requests && (w.Idle() || next <= 0) {
			p := prefixes[rng.IntN(len(prefixes))]
			if rng.IntN(4) == 0 {
				p = p[:rng.IntN(len(p)+1)]
			}
			prompt := append(slices.Clone(p), toks(rng.IntN(1<<20), 1+rng.IntN(3*cfg.BlockSize))...)
			if len(p) > 0 && rng.IntN(8) == 0 {
				// A repeated prompt: fully cached when p ends on a block boundary, so its
				// last block is recomputed and shares the cached copy.
				prompt = slices.Clone(p[:max(1, len(p)/cfg.BlockSize*cfg.BlockSize)])
			}
			id := uint64(submitted)
			r := &Request{ID: id, Tokens: prompt, Output: 1 + rng.IntN(40)}
			if err := w.Submit(r, 0); err == nil {
				accepted[id] = &pending{prompt: len(prompt), output: r.Output}
			} else if !errors.Is(err, ErrTooLarge) {
				t.Fatal(err)
			}
			submitted++
			next = int64(rng.IntN(3)) // steps until the next arrival
		}
		next--
		if w.Idle() {
			continue
		}
		if n := w.Step(0, &out); n <= 0 {
			t.Fatalf("step took %d ns", n)
		} else {
			put(uint64(n))
		}
		if err := w.check(); err != nil {
			t.Fatal(err)
		}
		if out.PrefillTokens+out.DecodeTokens > cfg.MaxBatchedTokens || w.Running() > cfg.MaxSeqs {
			t.Fatalf("step over limits: %d+%d tokens, %d running", out.PrefillTokens, out.DecodeTokens, w.Running())
		}
		m.apply(out.Events)
		if len(m.parent) != w.CachedBlocks() {
			t.Fatalf("model has %d blocks, worker %d", len(m.parent), w.CachedBlocks())
		}
		for h := range m.parent {
			if _, ok := w.byHash[h]; !ok {
				t.Fatalf("model block %x not cached by the worker", h)
			}
		}
		if len(m.host) != w.HostBlocks() {
			t.Fatalf("model has %d host blocks, worker %d", len(m.host), w.HostBlocks())
		}
		for h := range m.host {
			if !w.host.has(h) {
				t.Fatalf("model host block %x not in the worker's host tier", h)
			}
		}
		for _, ev := range out.Events {
			put(uint64(ev.Kind), ev.ID, ev.Parent)
			put(ev.Hashes...)
		}
		for _, e := range out.Emitted {
			p := accepted[e.ID]
			if p == nil || e.N != p.emitted+1 || e.N > p.output {
				t.Fatalf("bad Emitted %+v (%+v)", e, p)
			}
			p.emitted = e.N
			if (e.N == 1) != slices.ContainsFunc(out.PrefillDone, func(d Done) bool { return d.ID == e.ID }) ||
				(e.N == p.output) != slices.ContainsFunc(out.Completed, func(d Done) bool { return d.ID == e.ID }) {
				t.Fatalf("Emitted %+v disagrees with PrefillDone %+v and Completed %+v", e, out.PrefillDone, out.Completed)
			}
		}
		if len(out.Emitted) != out.DecodeTokens+len(out.PrefillDone) {
			t.Fatalf("%d emitted, %d decoded and %d first tokens", len(out.Emitted), out.DecodeTokens, len(out.PrefillDone))
		}
		for _, d := range out.PrefillDone {
			p := accepted[d.ID]
			if p == nil || p.prefill || d.Cached%cfg.BlockSize != 0 || d.Host%cfg.BlockSize != 0 || d.Cached+d.Host >= p.prompt {
				t.Fatalf("bad PrefillDone %+v", d)
			}
			p.prefill = true
			put(d.ID, uint64(d.Cached), uint64(d.Host))
		}
		for _, d := range out.Completed {
			p := accepted[d.ID]
			if p == nil || !p.prefill {
				t.Fatalf("bad Completed %+v", d)
			}
			delete(accepted, d.ID)
			put(d.ID)
		}
		if wl.abort > 0 && len(accepted) > 0 && rng.IntN(wl.abort) == 0 {
			ids := slices.Sorted(maps.Keys(accepted))
			id := ids[rng.IntN(len(ids))]
			if !w.Abort(id) {
				t.Fatalf("Abort(%d) of a request in flight: false", id)
			}
			if w.Abort(id) {
				t.Fatalf("Abort(%d) twice: true", id)
			}
			delete(accepted, id)
			if err := w.check(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(accepted) != 0 {
		t.Fatalf("%d requests never completed", len(accepted))
	}
	st := w.Stats()
	t.Logf("stats %+v", st)
	if st.EvictedBlocks == 0 || st.CachedTokens == 0 || cfg.HostBlocks > 0 && (st.HostTokens == 0 || st.HostEvictedBlocks == 0) {
		t.Errorf("workload too easy: %+v", st)
	}
	return digest.Sum64()
}

func TestEventStreamMatchesCache(t *testing.T) {
	for i, cfg := range []WorkerConfig{
		{Blocks: 64, BlockSize: 4, MaxSeqs: 4, MaxBatchedTokens: 32},
		{Blocks: 200, BlockSize: 4, MaxSeqs: 32, MaxBatchedTokens: 64},
		{Blocks: 128, BlockSize: 16, MaxSeqs: 8, MaxBatchedTokens: 4096},
		{Blocks: 40, BlockSize: 16, MaxSeqs: 1, MaxBatchedTokens: 7},
		{Blocks: 500, BlockSize: 1, MaxSeqs: 16, MaxBatchedTokens: 100},
		// With a host tier: evicted blocks move there and come back.
		{Blocks: 64, BlockSize: 4, MaxSeqs: 4, MaxBatchedTokens: 32, HostBlocks: 40},
		{Blocks: 128, BlockSize: 16, MaxSeqs: 8, MaxBatchedTokens: 4096, HostBlocks: 100},
		{Blocks: 40, BlockSize: 16, MaxSeqs: 1, MaxBatchedTokens: 7, HostBlocks: 10},
	} {
		t.Run(fmt.Sprintf("%d", i), func(t *testing.T) {
			simulate(t, workload{cfg: cfg, requests: 3000, seed: uint64(i)})
		})
	}
}

// TestAbortEventStream aborts requests at random, waiting and running, in the random workloads:
// the events still describe the cache exactly and every other request completes.
func TestAbortEventStream(t *testing.T) {
	for i, cfg := range []WorkerConfig{
		{Blocks: 64, BlockSize: 4, MaxSeqs: 4, MaxBatchedTokens: 32},
		{Blocks: 128, BlockSize: 16, MaxSeqs: 8, MaxBatchedTokens: 40},
	} {
		t.Run(fmt.Sprintf("%d", i), func(t *testing.T) {
			simulate(t, workload{cfg: cfg, requests: 2000, seed: uint64(100 + i), abort: 3})
		})
	}
}

func TestEmitted(t *testing.T) {
	w := NewWorker(1, WorkerConfig{Blocks: 100, BlockSize: 4, MaxBatchedTokens: 12})
	w.Submit(&Request{ID: 1, Tokens: toks(0, 6), Output: 3}, 0)
	w.Submit(&Request{ID: 2, Tokens: toks(100, 10), Output: 2}, 0)
	var out StepOutput
	var got [][]Token
	for now := int64(0); !w.Idle(); {
		now = w.Step(now, &out)
		got = append(got, slices.Clone(out.Emitted))
	}
	// Step 1: request 1's prompt (6) and 6 of request 2's; step 2: request 1 decodes, request
	// 2 finishes its prompt; step 3: both decode, and both are done.
	want := [][]Token{{{1, 1}}, {{1, 2}, {2, 1}}, {{1, 3}, {2, 2}}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Emitted per step %v, want %v", got, want)
	}
}

func TestAbort(t *testing.T) {
	const bs = 4
	w := NewWorker(1, WorkerConfig{Blocks: 32, BlockSize: bs, MaxSeqs: 2, MaxBatchedTokens: 8})
	var out StepOutput
	var now int64
	step := func() {
		t.Helper()
		now = w.Step(now, &out)
		if err := w.check(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		if err := w.Submit(&Request{ID: uint64(i + 1), Tokens: toks(100*i, 12), Output: 20}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if w.Abort(99) {
		t.Error("Abort of an unknown request: true")
	}
	// Request 3 leaves the queue before anything ran; 4 moves up behind 1 and 2.
	if !w.Abort(3) || w.Waiting() != 3 {
		t.Fatalf("Abort of a waiting request: waiting %d", w.Waiting())
	}
	step() // 1 gets 8 prompt tokens (2 full blocks stored); no budget is left to admit 2
	if w.Running() != 1 || w.Waiting() != 2 || w.CachedBlocks() != 2 {
		t.Fatalf("running %d, waiting %d, cached %d", w.Running(), w.Waiting(), w.CachedBlocks())
	}
	// Request 1 is mid-prefill: its two stored blocks stay cached, nothing is published.
	if !w.Abort(1) || w.Running() != 0 || w.CachedBlocks() != 2 || w.ActiveUsage() != 0 {
		t.Fatalf("after aborting 1: running %d, cached %d, active usage %v", w.Running(), w.CachedBlocks(), w.ActiveUsage())
	}
	step() // 2 gets 8 prompt tokens: one Stored event, no token yet
	if len(out.Events) != 1 || len(out.Emitted) != 0 {
		t.Fatalf("step after the abort: %+v", out)
	}
	for w.Waiting() > 0 || len(out.Emitted) == 0 || out.Emitted[0].N < 5 {
		step()
	}
	// Request 2 is decoding; 4 runs beside it.
	if !w.Abort(2) || w.Running() != 1 {
		t.Fatalf("Abort of a decoding request: running %d", w.Running())
	}
	_, outs := drain(t, w, now)
	for _, o := range outs {
		for _, e := range o.Emitted {
			if e.ID != 4 {
				t.Fatalf("aborted request %d emitted %+v", e.ID, e)
			}
		}
	}
	if last := outs[len(outs)-1].Completed; len(last) != 1 || last[0].ID != 4 {
		t.Fatalf("completed %+v, want request 4", last)
	}
	// Request 1's prompt again: the blocks its abort left cached are a hit.
	w.Submit(&Request{ID: 5, Tokens: toks(0, 12), Output: 1}, now)
	_, outs = drain(t, w, now)
	if d := outs[0].PrefillDone; len(d) != 1 || d[0].Cached != 8 {
		t.Errorf("PrefillDone %+v, want 8 cached tokens", d)
	}
	if st := w.Stats(); st.Aborted != 3 || st.Completed != 2 || st.Submitted != 5 {
		t.Errorf("stats %+v", st)
	}
}

func TestDeterminism(t *testing.T) {
	wl := workload{cfg: WorkerConfig{Blocks: 100, BlockSize: 4, MaxSeqs: 8, MaxBatchedTokens: 64}, requests: 2000, seed: 9}
	a, b := simulate(t, wl), simulate(t, wl)
	if a != b {
		t.Errorf("same inputs, digests %x and %x", a, b)
	}
	wl.seed++
	if c := simulate(t, wl); c == a {
		t.Errorf("different inputs, same digest")
	}
	// With a host tier too.
	wl.cfg.HostBlocks = 60
	if a, b := simulate(t, wl), simulate(t, wl); a != b {
		t.Errorf("host tier: same inputs, digests %x and %x", a, b)
	}
}

// steady drives a worker with a fixed pool of requests, keeping about load of them in flight.
type steady struct {
	w    *Worker
	reqs []Request
	i    int
	now  int64
	out  StepOutput
	load int
}

func newSteady(cfg WorkerConfig, load int) *steady {
	rng := rand.New(rand.NewPCG(1, 2))
	s := &steady{w: NewWorker(1, cfg), load: load}
	prefixes := make([][]uint32, 32)
	for i := range prefixes {
		prefixes[i] = toks(rng.IntN(1<<24), 64*(4+rng.IntN(16)))
	}
	for range 1024 {
		p := prefixes[rng.IntN(len(prefixes))]
		prompt := append(slices.Clone(p), toks(rng.IntN(1<<24), 64+rng.IntN(1024))...)
		s.reqs = append(s.reqs, Request{Tokens: prompt, Output: 16 + rng.IntN(256)})
	}
	return s
}

func (s *steady) step() {
	for s.w.Running()+s.w.Waiting() < s.load {
		r := &s.reqs[s.i%len(s.reqs)]
		r.ID = uint64(s.i)
		s.i++
		s.w.Submit(r, s.now)
	}
	s.now = s.w.Step(s.now, &s.out)
}

func TestWorkerStepAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("warm-up is long")
	}
	s := newSteady(WorkerConfig{}, 128)
	for range 20000 {
		s.step()
	}
	if n := testing.AllocsPerRun(2000, s.step); n > 0.01 {
		t.Errorf("%.3f allocations per steady-state step", n)
	}
}

// TestHostReloadTime: a block's reload is its bytes over the host link, worked by hand.
func TestHostReloadTime(t *testing.T) {
	// 64 tokens × 131,072 B = 8,388,608 B; / 14e9 B/s = 599.186286 µs.
	if got := HostReloadTime(64, KVBytesPerToken, HostBandwidth); got != 599186*time.Nanosecond {
		t.Errorf("default reload %v, want 599.186µs", got)
	}
	// 16 tokens × 1,000 B / 1e9 B/s = 16 µs.
	if got := HostReloadTime(16, 1000, 1e9); got != 16*time.Microsecond {
		t.Errorf("reload %v, want 16µs", got)
	}
	if HostReloadTime(64, KVBytesPerToken, 0) != 0 || HostReloadTime(0, 1, 1) != 0 {
		t.Error("a zero link or block size should cost nothing")
	}
	// Between a device hit (0) and a recompute of the block's tokens.
	tm := DefaultTiming()
	if r, c := HostReloadTime(64, KVBytesPerToken, HostBandwidth), tm.StepTime(64, 0, false); !(r > 0 && r < c) {
		t.Errorf("reload %v, recompute %v", r, c)
	}
	if got := NewWorker(1, WorkerConfig{BlockSize: 16, HostBlocks: 1}).Config().HostReload; got != HostReloadTime(16, KVBytesPerToken, HostBandwidth) {
		t.Errorf("default HostReload %v", got)
	}
}

// TestHostTier follows blocks from the device into the host tier and back, with the events a
// KVBM-style offload publishes and the reload's cost in the step that admits the request.
func TestHostTier(t *testing.T) {
	const bs = 4
	w := NewWorker(1, WorkerConfig{Blocks: 4, BlockSize: bs, HostBlocks: 3, HostReload: 5 * time.Millisecond})
	aTok, bTok := toks(0, 16), toks(100, 8)
	A, B := seqHashes(aTok, bs), seqHashes(bTok, bs)
	var h radix.Hasher
	aLoc, bLoc := h.AppendLocal(nil, aTok, bs, radix.LoRASeed("")), h.AppendLocal(nil, bTok, bs, radix.LoRASeed(""))
	type ev struct {
		kind   kvevent.Kind
		tier   kvevent.Tier
		hashes []uint64
		parent uint64
		locals []uint64
	}
	flat := func(outs []StepOutput) []ev {
		var evs []ev
		for _, o := range outs {
			for _, e := range o.Events {
				evs = append(evs, ev{e.Kind, e.Tier, e.Hashes, e.Parent, e.Locals})
			}
		}
		return evs
	}
	dev, host := kvevent.Device, kvevent.Host
	st, rm := kvevent.Stored, kvevent.Removed

	now := int64(0)
	w.Submit(&Request{ID: 1, Tokens: aTok, Output: 1}, now)
	now, _ = drain(t, w, now)
	// B needs two blocks: A's tail leaves the device for the host tier, child first.
	w.Submit(&Request{ID: 2, Tokens: bTok, Output: 1}, now)
	now, outs := drain(t, w, now)
	want := []ev{
		{st, host, A[3:4], A[2], aLoc[3:4]}, {rm, dev, A[3:4], 0, nil},
		{st, host, A[2:3], A[1], aLoc[2:3]}, {rm, dev, A[2:3], 0, nil},
		{st, dev, B[:2], 0, nil},
	}
	if got := flat(outs); !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n%+v\nwant\n%+v", got, want)
	}
	if w.HostBlocks() != 2 || w.CachedBlocks() != 4 {
		t.Fatalf("host %d, device %d blocks", w.HostBlocks(), w.CachedBlocks())
	}

	// A again: A0 and A1 hit on the device, A2 is reloaded from the host (A3 is computed: the
	// last block of a fully cached prompt always is). B's blocks move to the host tier, whose
	// oldest block, A3, leaves it.
	w.Submit(&Request{ID: 3, Tokens: aTok, Output: 1}, now)
	start := now
	now, outs = drain(t, w, now)
	if d := outs[0].PrefillDone; len(d) != 1 || d[0].Cached != 8 || d[0].Host != 4 {
		t.Fatalf("PrefillDone %+v, want 8 device and 4 host tokens", d)
	}
	// One step: 4 tokens computed at full usage, plus one block's reload.
	if want := start + int64(w.Config().Timing.StepTime(4, 1, true)+5*time.Millisecond); now != want {
		t.Errorf("step ended at %d, want %d", now, want)
	}
	want = []ev{
		{st, host, B[1:2], B[0], bLoc[1:2]}, {rm, dev, B[1:2], 0, nil},
		{st, dev, A[2:3], A[1], nil},
		{rm, host, A[3:4], 0, nil}, {st, host, B[0:1], 0, bLoc[0:1]}, {rm, dev, B[0:1], 0, nil},
		{st, dev, A[3:4], A[2], nil},
	}
	got := flat(outs)
	for i := range got {
		got[i].locals = slices.Clone(got[i].locals)
		if got[i].kind == st && got[i].tier == dev {
			got[i].locals = nil
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n%+v\nwant\n%+v", got, want)
	}
	if s := w.Stats(); s.HostTokens != 4 || s.HostStoredBlocks != 4 || s.HostEvictedBlocks != 1 || s.CachedTokens != 8 {
		t.Errorf("stats %+v", s)
	}
	for _, x := range []uint64{A[2], B[0], B[1]} {
		if !w.host.has(x) {
			t.Errorf("host tier lacks %x", x)
		}
	}
}

// A Remote request's prompt arrives computed: its blocks are stored (and published) at
// admission and only its last token is computed, on top of whatever the cache already held.
func TestRemotePrompt(t *testing.T) {
	w := NewWorker(1, WorkerConfig{Blocks: 16, BlockSize: 4})
	w.Submit(&Request{ID: 1, Tokens: toks(0, 10), Output: 3, Remote: true}, 0)
	now, outs := drain(t, w, 0)
	if d := outs[0].PrefillDone; outs[0].PrefillTokens != 1 || len(d) != 1 || d[0].Cached != 0 {
		t.Fatalf("first step: %d prefill tokens, PrefillDone %+v; want 1 token computed, the first output, no cache hit",
			outs[0].PrefillTokens, d)
	}
	want := seqHashes(toks(0, 10), 4)
	if ev := outs[0].Events; len(ev) != 1 || ev[0].Kind != kvevent.Stored || !slices.Equal(ev[0].Hashes, want) ||
		!slices.Equal(ev[0].Tokens, toks(0, 8)) {
		t.Fatalf("first step's events %+v: want the two transferred blocks stored", ev)
	}
	if st := w.Stats(); st.RemoteTokens != 9 || st.ComputedTokens != 1 || st.CachedTokens != 0 || st.Completed != 1 {
		t.Errorf("stats %+v", st)
	}

	// The same prompt extended, remote again: the cached two blocks are hits, the third block
	// arrives, the last token is computed.
	w.Submit(&Request{ID: 2, Tokens: toks(0, 14), Output: 1, Remote: true}, now)
	_, outs = drain(t, w, now)
	if d := outs[0].PrefillDone; len(d) != 1 || d[0].Cached != 8 || outs[0].PrefillTokens != 1 {
		t.Errorf("PrefillDone %+v, %d prefill tokens", d, outs[0].PrefillTokens)
	}
	if ev := outs[0].Events; len(ev) != 1 || !slices.Equal(ev[0].Hashes, seqHashes(toks(0, 14), 4)[2:3]) || ev[0].Parent != want[1] {
		t.Errorf("events %+v: want the third block stored under the second", ev)
	}
	if st := w.Stats(); st.RemoteTokens != 9+5 || st.ComputedTokens != 2 || st.CachedTokens != 8 {
		t.Errorf("stats %+v", st)
	}
}

// A Hold request's blocks stay pinned after it completes, safe from eviction, until Release.
func TestHoldRelease(t *testing.T) {
	w := NewWorker(1, WorkerConfig{Blocks: 6, BlockSize: 4})
	w.Submit(&Request{ID: 1, Tokens: toks(0, 10), Output: 1, Hold: true}, 0)
	now, outs := drain(t, w, 0)
	if c := outs[len(outs)-1].Completed; len(c) != 1 || c[0].ID != 1 || w.Held() != 1 {
		t.Fatalf("completed %+v, held %d", c, w.Held())
	}
	blocks, ok := w.AppendHeldBlocks(nil, 1)
	if !ok || len(blocks) != 3 || w.ActiveUsage() != 3.0/6 {
		t.Fatalf("held blocks %v (%v), active usage %v", blocks, ok, w.ActiveUsage())
	}
	if _, ok := w.AppendHeldBlocks(nil, 2); ok || w.Release(2) {
		t.Error("an unknown request is held")
	}
	// Two other prompts of three blocks each: the second evicts the first, never the held blocks.
	for i := range 2 {
		w.Submit(&Request{ID: uint64(10 + i), Tokens: toks(100*(i+1), 10), Output: 1}, now)
		now, _ = drain(t, w, now)
	}
	if w.Stats().EvictedBlocks != 2 {
		t.Fatalf("evicted %d blocks, want the first other prompt's 2", w.Stats().EvictedBlocks)
	}
	for _, h := range seqHashes(toks(0, 10), 4) {
		if _, ok := w.byHash[h]; !ok {
			t.Fatalf("a held block was evicted")
		}
	}
	if !w.Release(1) || w.Held() != 0 || w.ActiveUsage() != 0 || w.Release(1) {
		t.Fatalf("after Release: held %d, active usage %v", w.Held(), w.ActiveUsage())
	}
	if err := w.check(); err != nil {
		t.Fatal(err)
	}
	if w.CachedBlocks() != 4 {
		t.Errorf("cached %d blocks: the released prompt's two stay cached beside the last prompt's", w.CachedBlocks())
	}
}

// TestTimingBlocks: with TimingBlocks a larger cache decodes as the GPU of that capacity does,
// u being the blocks in use over TimingBlocks (capped at 1); without it, as a fraction of its
// own size, the same sequences decode faster in the larger cache.
func TestTimingBlocks(t *testing.T) {
	step := func(blocks, timing int) time.Duration {
		cfg := WorkerConfig{Blocks: blocks, BlockSize: 16, MaxSeqs: 8, MaxBatchedTokens: 4096, TimingBlocks: timing}
		w := NewWorker(1, cfg)
		// One request of 1,600 prompt tokens (100 blocks), decoding: its second step is a pure
		// decode step over its 100+ blocks.
		if err := w.Submit(&Request{ID: 1, Tokens: make([]uint32, 1600), Output: 4}, 0); err != nil {
			t.Fatal(err)
		}
		var out StepOutput
		end := w.Step(0, &out)
		next := w.Step(end, &out)
		return time.Duration(next - end)
	}
	tm := DefaultTiming()
	small, big := step(200, 0), step(800, 0)
	if big >= small {
		t.Errorf("decode %v in 800 blocks, %v in 200: the larger cache (u of its own size) should be faster", big, small)
	}
	if got := step(800, 200); got != small {
		t.Errorf("800 blocks timed as 200: %v, want the 200-block cache's %v", got, small)
	}
	// 101 blocks in use (the prompt's 100 and the first output token's) of 200: u = 0.505.
	if want := time.Duration(math.Round(tm.DecodeMs(101.0/200) * 1e6)); small != want {
		t.Errorf("decode step %v, want %v (u = 101/200)", small, want)
	}
	// Capped: 101 blocks timed against a 50-block GPU is u = 1, not 2.
	if got, want := step(800, 50), time.Duration(math.Round(tm.DecodeMs(1)*1e6)); got != want {
		t.Errorf("u over 1: %v, want the decode at u = 1, %v", got, want)
	}
}

func TestTimingSlowed(t *testing.T) {
	d := DefaultTiming()
	for _, c := range []struct {
		tokens  int
		u       float64
		decodes bool
	}{{0, 0.3, true}, {4096, 0, false}, {8192, 0.9, true}} {
		if got, want := d.Slowed(2).StepTime(c.tokens, c.u, c.decodes), 2*d.StepTime(c.tokens, c.u, c.decodes); got-want > 1 || want-got > 1 {
			t.Fatalf("%+v: half speed %v, want %v", c, got, want)
		}
	}
	if d.Slowed(1) != d || d.Slowed(0) != d {
		t.Fatal("a factor of 1 or 0 changed the timing")
	}
}
