package radix

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/xxh3"
)

// checkXXH3 holds the written-out hashes to xxh3.HashSeed for one input.
func checkXXH3(t *testing.T, toks *[16]uint32, seed, parent, local uint64) {
	t.Helper()
	b := make([]byte, 0, 64)
	for _, x := range toks {
		b = binary.LittleEndian.AppendUint32(b, x)
	}
	k := newBlockKeys(seed)
	if got, want := k.hash16(toks), xxh3.HashSeed(b, seed); got != want {
		t.Fatalf("hash16(%v, seed %d) = %#x, xxh3.HashSeed %#x", toks, seed, got, want)
	}
	var p [16]byte
	binary.LittleEndian.PutUint64(p[:], parent)
	binary.LittleEndian.PutUint64(p[8:], local)
	if got, want := seqHash(parent, local), xxh3.HashSeed(p[:], BaseSeed); got != want {
		t.Fatalf("seqHash(%#x, %#x) = %#x, xxh3.HashSeed %#x", parent, local, got, want)
	}
}

func TestXXH3Specialized(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	seeds := []uint64{0, 1, BaseSeed, LoRASeed("my-adapter"), Seed("a", "tenant"), math.MaxUint64}
	for i := range 20000 {
		var toks [16]uint32
		for j := range toks {
			switch i % 3 {
			case 0:
				toks[j] = rng.Uint32N(200000)
			case 1:
				toks[j] = rng.Uint32()
			}
		}
		seed := seeds[i%len(seeds)]
		if i%7 == 0 {
			seed = rng.Uint64()
		}
		checkXXH3(t, &toks, seed, rng.Uint64(), rng.Uint64())
	}
	var h Hasher
	toks := make([]uint32, 16*9+5)
	for i := range toks {
		toks[i] = rng.Uint32()
	}
	got := h.AppendSequence(nil, toks, 16, BaseSeed)
	h.forceCopy = true
	parent := uint64(0)
	for i := range 9 {
		want := xxh3.HashSeed(h.tokenBytes(toks[16*i:16*i+16]), BaseSeed)
		if i > 0 {
			var p [16]byte
			binary.LittleEndian.PutUint64(p[:], parent)
			binary.LittleEndian.PutUint64(p[8:], want)
			want = xxh3.HashSeed(p[:], BaseSeed)
		}
		if got[i] != want {
			t.Fatalf("block %d: sequence hash %#x, want %#x", i, got[i], want)
		}
		parent = want
	}
	if len(got) != 9 {
		t.Fatalf("%d sequence hashes of 9 full blocks", len(got))
	}
}

func FuzzXXH3(f *testing.F) {
	f.Add(make([]byte, 64), uint64(BaseSeed), uint64(0), uint64(0))
	f.Add([]byte("sixty-four bytes of token ids, or fewer: the rest are zero ids."), uint64(0), uint64(1), uint64(1<<63))
	f.Add(make([]byte, 64), uint64(math.MaxUint64), uint64(math.MaxUint64), uint64(math.MaxUint64))
	f.Fuzz(func(t *testing.T, b []byte, seed, parent, local uint64) {
		var toks [16]uint32
		for j := range toks {
			if len(b) >= 4*j+4 {
				toks[j] = binary.LittleEndian.Uint32(b[4*j:])
			}
		}
		checkXXH3(t, &toks, seed, parent, local)
	})
}
