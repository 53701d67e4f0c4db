package router

import (
	"fmt"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestMaxIndexBytes: under a stream of stores ten times what MaxIndexBytes holds, the index never
// holds more residencies than the bound allows and skips no store; it evicts, from the workers
// holding the most, their least recently matched blocks: a chain matched before every batch
// stays whole, a small worker keeps everything, the large ones end even. What it keeps is
// exact: every worker's blocks are in the index and nothing else, and matches equal a reference
// index built from the workers' own state.
func TestMaxIndexBytes(t *testing.T) {
	for _, shards := range []int{1, 2} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			const budget = 400
			r := New(Config{Shards: shards, MaxIndexBytes: budget * ResidencyBytes, Logger: quiet()})
			t.Cleanup(r.Close)
			for id := uint64(1); id <= 4; id++ {
				if err := r.Register(Registration{ID: id, Model: "m", BlockSize: 4}); err != nil {
					t.Fatal(err)
				}
			}
			next := uint32(0)
			chain := func() []uint32 { // 4 blocks of fresh tokens
				toks := make([]uint32, 16)
				for i := range toks {
					toks[i] = next
					next++
				}
				return toks
			}
			ids := map[uint64]uint64{}
			store := func(w uint64, toks []uint32) {
				t.Helper()
				ev := kvevent.Event{Kind: kvevent.Stored, Tokens: toks}
				for range len(toks) / 4 {
					ev.Hashes = append(ev.Hashes, uint64(next)<<8|w)
					next++
				}
				ids[w]++
				ev.ID = ids[w]
				if _, err := r.ApplyEvents(&wire.EventBatch{Worker: w, Model: "m", Events: []kvevent.Event{ev}}, nil); err != nil {
					t.Fatal(err)
				}
			}
			hot := chain()
			store(1, hot)
			var chains [][]uint32
			for range 2 {
				c := chain()
				chains = append(chains, c)
				store(4, c)
			}
			// A reader matching all along, as gateways do while events apply and evict.
			stop, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				var resp wire.RouteResponse
				for i := uint32(0); ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					_ = r.Match(&wire.RouteRequest{Model: "m", Tokens: []uint32{i % 4000, i%4000 + 1, i%4000 + 2, i%4000 + 3}}, &resp)
				}
			}()
			for range 300 {
				var resp wire.RouteResponse
				if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: hot}, &resp); err != nil {
					t.Fatal(err)
				}
				for w := uint64(1); w <= 3; w++ {
					c := chain()
					chains = append(chains, c)
					store(w, c)
				}
				if n := r.set.Stats().Residencies; n > budget {
					t.Fatalf("%d residencies, over the bound of %d", n, budget)
				}
			}
			close(stop)
			<-done
			st := r.set.Stats()
			if st.Evicted < 3000 || st.SkippedBlocks != 0 {
				t.Fatalf("evicted %d, skipped %d: want about 3,200 evicted and nothing skipped", st.Evicted, st.SkippedBlocks)
			}
			m := (*r.models.Load())["m"]
			held := map[uint64]int{}
			ref := refmodel.NewIndex()
			for w := uint64(1); w <= 4; w++ {
				for _, b := range r.DumpWorker(w, nil) {
					ref.Add(b.Seq, radix.WorkerKey{ID: w, Rank: b.Rank})
					held[w]++
				}
				slot, _ := m.ix.Lookup(radix.WorkerKey{ID: w})
				if int(m.ix.Blocks(slot)) != held[w] {
					t.Fatalf("worker %d: %d blocks in the index, %d in its state", w, m.ix.Blocks(slot), held[w])
				}
			}
			if held[4] != 8 {
				t.Errorf("the small worker holds %d of its 8 blocks", held[4])
			}
			if lo, hi := min(held[1], held[2], held[3]), max(held[1], held[2], held[3]); hi-lo > 2*64 {
				t.Errorf("large workers hold %d, %d, %d blocks: not even", held[1], held[2], held[3])
			}
			var h radix.Hasher
			seqsOf := func(toks []uint32) []uint64 {
				s := h.AppendLocal(nil, toks, 4, radix.BaseSeed)
				radix.ChainInPlace(s, 0, false)
				return s
			}
			var mt radix.Match
			if err := ref.CheckMatch(m.ix, seqsOf(hot), &mt); err != nil {
				t.Fatal(err)
			}
			if got := ref.Match(seqsOf(hot)); got[radix.WorkerKey{ID: 1}] != 4 {
				t.Errorf("the chain matched before every batch: worker 1 holds %d of its 4 blocks", got[radix.WorkerKey{ID: 1}])
			}
			for _, c := range chains {
				if err := ref.CheckMatch(m.ix, seqsOf(c), &mt); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
