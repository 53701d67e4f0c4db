package radix_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/zeebo/xxh3"
)

func iota32(n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(i)
	}
	return t
}

// The golden vectors of Dynamo's router (reference.md section 1).
func TestHashGolden(t *testing.T) {
	if got := xxh3.HashSeed([]byte("test data"), radix.BaseSeed); got != 13226331709069118873 {
		t.Fatalf(`"test data": got %d`, got)
	}
	f := func(name string, seed uint64, wantLocal, wantSeq []uint64) {
		t.Helper()
		var h radix.Hasher
		local := h.AppendLocal(nil, iota32(8), 4, seed)
		if !slices.Equal(local, wantLocal) {
			t.Errorf("%s: local %v, want %v", name, local, wantLocal)
		}
		if wantSeq == nil {
			return
		}
		if seq := h.AppendSequence(nil, iota32(8), 4, seed); !slices.Equal(seq, wantSeq) {
			t.Errorf("%s: sequence %v, want %v", name, seq, wantSeq)
		}
	}
	f("base", radix.BaseSeed,
		[]uint64{9143094415614847814, 12124091508212882195},
		[]uint64{9143094415614847814, 9510318385840434533})
	f("lora", radix.LoRASeed("my-adapter"),
		[]uint64{13692202469334984872, 14659540909498545450}, nil)
	if radix.LoRASeed("") != radix.BaseSeed {
		t.Error("empty LoRA name must be the base model")
	}
}

// Dynamo's cache salt (lib/kv-hashing salt.rs, compute_salt_hash): the salt's XXH3-64 with seed
// 1 is added to the LoRA seed. The vectors were computed apart from this package, with Python's
// xxhash, by that rule; "test data" and the base vectors above are Dynamo's own.
func TestSeedGolden(t *testing.T) {
	if got := xxh3.HashStringSeed("tenant-a", 1); got != 1948188790972762749 {
		t.Fatalf(`XXH3-64("tenant-a", seed 1) = %d`, got)
	}
	var h radix.Hasher
	for _, c := range []struct {
		lora, salt string
		want       uint64 // the local hash of tokens 0..3, block size 4
	}{
		{"", "", 9143094415614847814},
		{"", "tenant-a", 17009624042690211646},
		{"", "tenant-b", 370894731093104760},
		{"tenant-a", "", 582854293518545300}, // a LoRA name is not a salt of the same text
		{"adapter-a", "", 6665157333201000639},
		{"adapter-a", "tenant-a", 8269515957840517240},
	} {
		if got := h.AppendLocal(nil, iota32(4), 4, radix.Seed(c.lora, c.salt)); len(got) != 1 || got[0] != c.want {
			t.Errorf("lora %q, salt %q: %v, want [%d]", c.lora, c.salt, got, c.want)
		}
	}
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	for _, c := range []struct {
		lora, salt      string
		seed            uint64
		wantLocal, want []uint64
	}{
		{"", "", 1337, []uint64{14643705804678351452, 16777012769546811212}, []uint64{14643705804678351452, 4945711292740353085}},
		{"lora_7", "", 3865872906902550615, []uint64{6090315765804930700, 3193399369686574168}, []uint64{6090315765804930700, 15860345950305936478}},
		{"", "tenant-a", 1948188790972764086, []uint64{5738685477468498325, 11202231085456067787}, []uint64{5738685477468498325, 1076233986426276607}},
		{"lora_7", "tenant-a", 5814061697875313364, []uint64{6743904198711443130, 10155839060712525520}, []uint64{6743904198711443130, 12484148186234572482}},
	} {
		seed := radix.Seed(c.lora, c.salt)
		if seed != c.seed {
			t.Errorf("lora %q, salt %q: seed %d, want %d", c.lora, c.salt, seed, c.seed)
		}
		if got := h.AppendLocal(nil, toks, 4, seed); !slices.Equal(got, c.wantLocal) {
			t.Errorf("lora %q, salt %q: local %v, want %v", c.lora, c.salt, got, c.wantLocal)
		}
		if got := h.AppendSequence(nil, toks, 4, seed); !slices.Equal(got, c.want) {
			t.Errorf("lora %q, salt %q: sequence %v, want %v", c.lora, c.salt, got, c.want)
		}
	}
	if radix.Seed("x", "") != radix.LoRASeed("x") {
		t.Error("an empty salt must change nothing")
	}
}

func TestHashOnlyFullBlocks(t *testing.T) {
	var h radix.Hasher
	full := h.AppendSequence(nil, iota32(8), 4, radix.BaseSeed)
	for n := 8; n < 12; n++ {
		if got := h.AppendSequence(nil, iota32(n), 4, radix.BaseSeed); !slices.Equal(got, full) {
			t.Errorf("%d tokens: %v, want the 2 full blocks %v", n, got, full)
		}
	}
	if got := h.AppendSequence(nil, iota32(3), 4, radix.BaseSeed); len(got) != 0 {
		t.Errorf("3 tokens, block size 4: %v, want none", got)
	}
	// Block size 1 (SGLang's default page size): one block per token.
	if got := h.AppendLocal(nil, iota32(5), 1, radix.BaseSeed); len(got) != 5 {
		t.Errorf("block size 1: %d hashes, want 5", len(got))
	}
}

// The hasher against the model's independent implementation: random tokens, block sizes, LoRA,
// multimodal hashes, and the copying path used on big-endian machines.
func TestHashMatchesModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		bs := []int{1, 2, 4, 16, 64}[r.IntN(5)]
		tokens := make([]uint32, r.IntN(6*bs+1))
		for i := range tokens {
			tokens[i] = r.Uint32()
		}
		lora := []string{"", "a", "my-adapter"}[r.IntN(3)]
		n := len(tokens) / bs
		mm := make([][]uint64, n)
		for i := range mm {
			for range r.IntN(4) {
				mm[i] = append(mm[i], r.Uint64())
			}
		}
		var want []uint64
		for i := range n {
			l := refmodel.LocalHash(tokens[i*bs:(i+1)*bs], lora, mm[i])
			if i > 0 {
				l = refmodel.SeqHash(want[i-1], l)
			}
			want = append(want, l)
		}
		for _, copyPath := range []bool{false, true} {
			h := radix.NewHasherForTest(copyPath)
			got := h.AppendLocalMM(nil, tokens, bs, radix.LoRASeed(lora), mm)
			radix.ChainInPlace(got, 0, false)
			if !slices.Equal(got, want) {
				t.Fatalf("bs=%d lora=%q copy=%v: got %v want %v", bs, lora, copyPath, got, want)
			}
			if lora == "" {
				if got := h.AppendSequence(nil, tokens, bs, radix.BaseSeed); !slices.Equal(got, refmodel.SeqHashes(tokens, bs, "")) {
					t.Fatalf("AppendSequence bs=%d copy=%v differs from the model", bs, copyPath)
				}
			}
			// Without multimodal hashes, under the LoRA seed, appended after hashes already
			// there: AppendLocal and ChainInPlace, and AppendSequence's one pass (16-token
			// blocks read their ids as words, so copy=true takes the same path there).
			pre := []uint64{7, 8}
			var plain []uint64
			for i := range n {
				l := refmodel.LocalHash(tokens[i*bs:(i+1)*bs], lora, nil)
				if i > 0 {
					l = refmodel.SeqHash(plain[i-1], l)
				}
				plain = append(plain, l)
			}
			got = h.AppendLocal(slices.Clone(pre), tokens, bs, radix.LoRASeed(lora))
			radix.ChainInPlace(got[len(pre):], 0, false)
			if !slices.Equal(got[:len(pre)], pre) || !slices.Equal(got[len(pre):], plain) {
				t.Fatalf("AppendLocal bs=%d lora=%q copy=%v: got %v want %v after %v", bs, lora, copyPath, got, plain, pre)
			}
			got = h.AppendSequence(slices.Clone(pre), tokens, bs, radix.LoRASeed(lora))
			if !slices.Equal(got[:len(pre)], pre) || !slices.Equal(got[len(pre):], plain) {
				t.Fatalf("AppendSequence bs=%d lora=%q copy=%v: got %v want %v after %v", bs, lora, copyPath, got, plain, pre)
			}
		}
		// The multimodal hashes' order must not matter; the caller's slices stay untouched.
		for _, x := range mm {
			slices.Reverse(x)
		}
		before := slices.Clone(mm)
		var h radix.Hasher
		got := h.AppendLocalMM(nil, tokens, bs, radix.LoRASeed(lora), mm)
		radix.ChainInPlace(got, 0, false)
		if !slices.Equal(got, want) {
			t.Fatal("mm hash depends on the order the hashes were given in")
		}
		for i := range mm {
			if !slices.Equal(mm[i], before[i]) {
				t.Fatal("AppendLocalMM reordered the caller's slice")
			}
		}
	}
}

func TestChainInPlaceWithParent(t *testing.T) {
	var h radix.Hasher
	all := h.AppendSequence(nil, iota32(12), 4, radix.BaseSeed)
	tail := h.AppendLocal(nil, iota32(12)[4:], 4, radix.BaseSeed)
	radix.ChainInPlace(tail, all[0], true)
	if !slices.Equal(tail, all[1:]) {
		t.Fatalf("chained tail %v, want %v", tail, all[1:])
	}
}

func TestHashAllocs(t *testing.T) {
	tokens := iota32(16 * 128)
	mm := [][]uint64{{3, 1, 2}, nil, {7}}
	buf := make([]uint64, 0, 128)
	for _, copyPath := range []bool{false, true} {
		h := radix.NewHasherForTest(copyPath)
		h.AppendLocalMM(buf[:0], tokens, 16, radix.BaseSeed, mm) // warm the scratch
		if n := testing.AllocsPerRun(100, func() {
			buf = h.AppendSequence(buf[:0], tokens, 16, radix.BaseSeed)
		}); n != 0 {
			t.Errorf("AppendSequence (copy=%v): %v allocs, want 0", copyPath, n)
		}
		if n := testing.AllocsPerRun(100, func() {
			buf = h.AppendLocalMM(buf[:0], tokens, 16, radix.LoRASeed("x"), mm)
		}); n != 0 {
			t.Errorf("AppendLocalMM (copy=%v): %v allocs, want 0", copyPath, n)
		}
	}
}
