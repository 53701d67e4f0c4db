package replay

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/shard"
)

const testBlockSize = 16

// smallTrace is a two-minute synthetic workload of a few hundred requests whose prompts fit a
// small cache many times over, so that the workers evict.
func smallTrace() []trace.Request {
	c := trace.DefaultSynthetic()
	c.Duration = 2 * time.Minute
	c.SystemTokens, c.TurnTokens, c.DocTokens, c.Output = 256, 64, 512, 32
	return trace.Synthetic(c)
}

func smallFleet(onEvents func(time.Duration, uint64, []kvevent.Event)) fleet.Config {
	wc := sim.DefaultWorkerConfig()
	wc.BlockSize, wc.Blocks = testBlockSize, 128
	return fleet.Config{Workers: 8, Mode: scoring.KV, Worker: wc, Seed: 1, OnEvents: onEvents}
}

// model is the reference: per worker, engine hash → sequence hash, built from the events as the
// fleet published them, with the hashing written out block by block.
type model map[uint64]map[uint64]uint64

func (m model) apply(worker uint64, evs []kvevent.Event) {
	held := m[worker]
	if held == nil {
		held = make(map[uint64]uint64)
		m[worker] = held
	}
	var h radix.Hasher
	for _, ev := range evs {
		switch ev.Kind {
		case kvevent.Stored:
			seq, ok := held[ev.Parent]
			if ev.HasParent && !ok {
				panic("model: unknown parent")
			}
			for i, eh := range ev.Hashes {
				local := h.AppendLocal(nil, ev.Tokens[i*testBlockSize:(i+1)*testBlockSize], testBlockSize, radix.BaseSeed)[0]
				if i == 0 && !ev.HasParent {
					seq = local
				} else {
					seq = radix.SeqHash(seq, local)
				}
				held[eh] = seq
			}
		case kvevent.Removed:
			for _, eh := range ev.Hashes {
				delete(held, eh)
			}
		case kvevent.Cleared:
			clear(held)
		}
	}
}

func record(t *testing.T, reqs []trace.Request, onEvents func(time.Duration, uint64, []kvevent.Event)) *Stream {
	t.Helper()
	s, err := Record(reqs, smallFleet(onEvents))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRecordReplay checks that the stream, replayed into an index through the shards, leaves
// every worker of every group with exactly the blocks the fleet's events describe.
func TestRecordReplay(t *testing.T) {
	ref := make(model)
	var stored, removed int64
	s := record(t, smallTrace(), func(_ time.Duration, w uint64, evs []kvevent.Event) {
		if w == 3 {
			// Tokens found in no prompt: the stream must copy them.
			for _, ev := range evs {
				for i := range ev.Tokens {
					ev.Tokens[i] ^= 1 << 31
				}
			}
		}
		ref.apply(w, evs)
		for _, ev := range evs {
			switch ev.Kind {
			case kvevent.Stored:
				stored += int64(len(ev.Hashes))
			case kvevent.Removed:
				removed += int64(len(ev.Hashes))
			}
		}
	})
	st := s.Stats()
	if st.Stored != stored || st.Removed != removed || s.Blocks() != stored || st.Workers != 8 || st.BlockSize != testBlockSize {
		t.Fatalf("stream %+v, the fleet published %d stored and %d removed blocks", st, stored, removed)
	}
	if sim := s.Fleet(); len(sim.Blocks) != 8 {
		t.Fatalf("the fleet reports the blocks of %d workers", len(sim.Blocks))
	} else {
		for i, n := range sim.Blocks {
			if len(ref[uint64(i+1)]) != n {
				t.Fatalf("worker %d: its events leave %d blocks, its cache holds %d", i+1, len(ref[uint64(i+1)]), n)
			}
		}
	}
	if st.Copied == 0 || st.Copied == st.Stored {
		t.Fatalf("%d of %d stored blocks copied: only worker 3's should be", st.Copied, st.Stored)
	}
	if removed == 0 {
		t.Fatalf("no evictions: the test does not exercise removals (%+v)", st)
	}
	t.Logf("stream: %+v", st)

	const groups = 3
	r := &run{s: s, cfg: Config{Workers: groups * 8}, groups: groups}
	r.ix, _ = radix.New(radix.Config{BlockSize: testBlockSize})
	r.set = shard.New(shard.Config{Shards: 2})
	defer r.set.Close()
	r.n = len(s.batches)
	if err := r.enqueue(0, r.rounds()); err != nil {
		t.Fatal(err)
	}
	if err := r.set.Barrier(); err != nil {
		t.Fatal(err)
	}
	if err := anomalies(r.set.Stats()); err != nil {
		t.Fatal(err)
	}
	var total int64
	for id := uint64(1); id <= groups*8; id++ {
		want := ref[(id-1)%8+1]
		got := make(map[uint64]uint64)
		if err := r.set.Do(id, func(a *shard.Applier) {
			a.EachBlock(id, func(_ uint32, eh, seq uint64) { got[eh] = seq })
		}); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("worker %d: %d blocks, the fleet's events leave %d", id, len(got), len(want))
		}
		slot, ok := r.ix.Lookup(radix.WorkerKey{ID: id})
		if !ok {
			t.Fatalf("worker %d has no slot", id)
		}
		if n := r.ix.Blocks(slot); n != int64(len(want)) {
			t.Fatalf("worker %d: the index holds %d blocks, want %d", id, n, len(want))
		}
		for eh, seq := range want {
			if got[eh] != seq || !r.ix.Has(seq, slot) {
				t.Fatalf("worker %d: engine block %x: sequence hash %x (in index: %t), want %x",
					id, eh, got[eh], r.ix.Has(seq, slot), seq)
			}
		}
		total += int64(len(want))
	}
	if ixs := r.ix.Stats(); ixs.Residencies != total || ixs.Workers != groups*8 {
		t.Fatalf("index %+v, want %d residencies over %d workers", ixs, total, groups*8)
	}
}

// heldAfter counts, with a plain model, the blocks the stream's workers hold after n batches.
func heldAfter(s *Stream, n int) int64 {
	held := make(map[[2]uint64]bool)
	for _, b := range s.batches[:n] {
		for _, e := range s.events[b.ev0:b.ev1] {
			for _, h := range s.hashes[e.h0:e.h1] {
				k := [2]uint64{uint64(b.worker), h}
				if e.kind == kvevent.Stored {
					held[k] = true
				} else {
					delete(held, k)
				}
			}
		}
	}
	return int64(len(held))
}

func TestRun(t *testing.T) {
	s := record(t, smallTrace(), nil)
	st := s.Stats()
	f := func(workers int, maxRes int64, writeRate float64, whole bool) {
		t.Helper()
		res, err := Run(s, Config{Workers: workers, MaxResidencies: maxRes, MatchFor: 100 * time.Millisecond, SizePoints: 4,
			WriteRate: writeRate, Seed: 7})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d workers: %+v", workers, *res)
		groups := workers / 8
		if res.Workers != workers || res.Groups != groups || res.Shards < 1 {
			t.Fatalf("workers %d, groups %d, shards %d", res.Workers, res.Groups, res.Shards)
		}
		n := res.Batches
		if n < 1 || n > len(s.batches) || (n == len(s.batches)) != whole || (res.Prefix == 1) != whole {
			t.Fatalf("%d of %d batches replayed (prefix %v), want whole=%t", n, len(s.batches), res.Prefix, whole)
		}
		if res.Stored != int64(groups)*s.batches[n-1].stored || res.Stored > maxRes {
			t.Fatalf("%d blocks stored, want %d groups × %d, at most %d", res.Stored, groups, s.batches[n-1].stored, maxRes)
		}
		if want := int64(groups) * heldAfter(s, n); res.Residencies != want || res.Residencies != res.Stored-res.Removed {
			t.Fatalf("%d residencies, %d stored − %d removed; the model holds %d", res.Residencies, res.Stored, res.Removed, want)
		}
		if res.Entries < 1 || res.Entries > res.Residencies || groups > 1 && res.Entries*2 > res.Residencies {
			t.Fatalf("%d blocks for %d residencies over %d groups", res.Entries, res.Residencies, groups)
		}
		if !(res.ApplyTime > 0 && res.ApplyRate > 0 && res.WriteTime > 0 && res.WriteRate > 0) {
			t.Fatalf("apply %v (%v/s), write %v (%v/s)", res.ApplyTime, res.ApplyRate, res.WriteTime, res.WriteRate)
		}
		if res.Written == 0 || res.Written%2 != 0 {
			t.Fatalf("the writer applied %d blocks: churn removes and restores the same blocks", res.Written)
		}
		switch {
		case writeRate < 0 && res.WriteTarget != 0,
			writeRate > 0 && res.WriteTarget != writeRate,
			writeRate == 0 && res.WriteTarget != float64(st.Stored+st.Removed)/st.Span.Seconds()*float64(groups):
			t.Fatalf("the writer aimed at %v blocks/s, asked %v, the stream's own rate %v × %d", res.WriteTarget, writeRate,
				float64(st.Stored+st.Removed)/st.Span.Seconds(), groups)
		}
		if res.Queries < 1 || res.Queries > st.Queries {
			t.Fatalf("queries drawn from %d of %d requests", res.Queries, st.Queries)
		}
		if res.Matches < 1 || !(0 < res.P50 && res.P50 <= res.P99 && res.P99 <= res.P999) {
			t.Fatalf("%d matches: p50 %v, p99 %v, p99.9 %v", res.Matches, res.P50, res.P99, res.P999)
		}
		if res.Lookups < 1 || res.Holders < 0 || res.Holders > float64(workers) {
			t.Fatalf("%v lookups, %v holders per match", res.Lookups, res.Holders)
		}
		if res.HeapBytes <= 0 || res.BytesPerResidency <= 0 || res.PoolBytes < 0 {
			t.Fatalf("heap %d B, %v B/residency, pool %d B", res.HeapBytes, res.BytesPerResidency, res.PoolBytes)
		}
		if len(res.Sizes) < 1 || len(res.Sizes) > 4 || res.Sizes[len(res.Sizes)-1].Residencies != res.Residencies {
			t.Fatalf("size points %+v, the index holds %d", res.Sizes, res.Residencies)
		}
		for _, p := range res.Sizes {
			if p.Matches < 1 || p.Residencies < 1 || !(0 < p.P50 && p.P50 <= p.P99) {
				t.Fatalf("size point %+v", p)
			}
		}
	}
	f(8, DefaultMaxResidencies, 0, true)
	f(24, DefaultMaxResidencies, 0, true)
	f(16, DefaultMaxResidencies, -1, true) // the writer as fast as it can
	f(32, s.Blocks(), 1e5, false)          // a quarter of the stream per group
}

func TestRunErrors(t *testing.T) {
	s := record(t, smallTrace(), nil)
	f := func(cfg Config) {
		t.Helper()
		if _, err := Run(s, cfg); err == nil {
			t.Fatalf("Run(%+v) succeeded", cfg)
		}
	}
	f(Config{Workers: 12})                             // not a multiple of 8
	f(Config{Workers: 8 * 1000, MaxResidencies: 1000}) // one stored block per group
	f(Config{Workers: radix.MaxSlots + 1})
}

func TestRecordUnsupported(t *testing.T) {
	reqs := smallTrace()
	cfg := smallFleet(func(_ time.Duration, _ uint64, evs []kvevent.Event) {
		for i := range evs {
			evs[i].LoRA = "adapter" // what the stream would see from a LoRA-serving engine
		}
	})
	if _, err := Record(reqs, cfg); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Record of LoRA events: %v, want ErrUnsupported", err)
	}
}

func TestQuantile(t *testing.T) {
	f := func(n int, p float64, want time.Duration) {
		t.Helper()
		s := make([]time.Duration, n)
		for i := range s {
			s[i] = time.Duration(i + 1)
		}
		if got := quantile(s, p); got != want {
			t.Fatalf("quantile of 1..%d at %v = %v, want %v", n, p, got, want)
		}
	}
	f(0, 0.5, 0)
	f(1, 0.999, 1)
	f(100, 0.5, 50)
	f(100, 0.99, 99)
	f(1000, 0.999, 999)
	f(1001, 0.999, 1000)
	f(10, 1, 10)
}

// traceDir is where the real Mooncake traces live: $KVROUTERD_TRACES/mooncake, or the shared
// folder beside the repository.
func traceDir() string {
	if d := os.Getenv("KVROUTERD_TRACES"); d != "" {
		return filepath.Join(d, "mooncake")
	}
	return filepath.Join("..", "..", "..", "shared", "traces", "mooncake")
}

func loadConversation(tb testing.TB, limit int) []trace.Request {
	tb.Helper()
	path := filepath.Join(traceDir(), "conversation_trace.jsonl")
	if _, err := os.Stat(path); err != nil {
		tb.Skipf("trace %s absent (%v); set KVROUTERD_TRACES to the folder holding mooncake/", path, err)
	}
	reqs, err := trace.LoadMooncake(path, trace.MooncakeOptions{Limit: limit})
	if err != nil {
		tb.Fatal(err)
	}
	return reqs
}

// TestConversationTrace records the first rows of the real trace and replays them at 8 and 80
// workers.
func TestConversationTrace(t *testing.T) {
	if raceEnabled {
		// bench/fleet's router reads the simulated clock from its expiry goroutine, which ticks
		// every wall second: a race once a recording lasts longer, as this one does under -race.
		t.Skip("the recording takes seconds under -race")
	}
	reqs := loadConversation(t, 300)
	s, err := Record(reqs, fleet.Config{Workers: 8, Mode: scoring.KV, Worker: sim.DefaultWorkerConfig(), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stream: %+v", s.Stats())
	for _, w := range []int{8, 80} {
		res, err := Run(s, Config{Workers: w, MatchFor: 50 * time.Millisecond, SizePoints: 2})
		if err != nil {
			t.Fatal(err)
		}
		if res.Residencies != int64(w/8)*heldAfter(s, res.Batches) || res.Matches < 1 || res.Holders <= 0 {
			t.Fatalf("%d workers: %+v", w, *res)
		}
	}
}
