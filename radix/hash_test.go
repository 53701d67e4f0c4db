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
