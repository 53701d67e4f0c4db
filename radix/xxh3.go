package radix

import "math/bits"

// XXH3-64 with a seed, written out for the two inputs the hot paths hash millions of times: a
// block of 16 token ids (64 bytes, the block size of vLLM, SGLang and Dynamo by default) and a
// (parent, local) pair of sequence hashes (16 bytes). The general xxh3.HashSeed takes a call, a
// switch on the length and byte loads; here the token ids are read as words, the seed is mixed
// into the keys once per call rather than once per block, and both inline into their loops.
// TestXXH3Specialized and FuzzXXH3 hold them to xxh3.HashSeed, bit for bit.

// The first 64 bytes of XXH3's default secret, as little-endian words.
const (
	xsecret00 = 0xbe4ba423396cfeb8
	xsecret08 = 0x1cad21f72c81017c
	xsecret16 = 0xdb979083e96dd4de
	xsecret24 = 0x1f67b3b7a4a44072
	xsecret32 = 0x78e5c0cc4ee679cb
	xsecret40 = 0x2172ffcc7dd05a82
	xsecret48 = 0x8e2443f7744608b8
	xsecret56 = 0x4c263a81e69035e0

	xprime64_1 = 0x9e3779b185ebca87
	xmix       = 0x165667919e3779f9 // the avalanche's multiplier

	// x64len is XXH3's starting accumulator for a 64-byte input: 64·prime64_1, wrapped.
	x64len uint64 = xprime64_1 << 6 & (1<<64 - 1)
)

// seqFlipLo and seqFlipHi are the keys of a 16-byte input under BaseSeed (XXH3's 9-to-16-byte
// case): the bit flips of its low and high word. Constants, so they do not wrap: a BaseSeed above
// xsecret40^xsecret48 would not compile here, where XXH3 wraps (newBlockKeys wraps, at run time).
const (
	seqFlipLo uint64 = (xsecret24 ^ xsecret32) + BaseSeed
	seqFlipHi uint64 = (xsecret40 ^ xsecret48) - BaseSeed
)

func xfold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

func xavalanche(h uint64) uint64 {
	h ^= h >> 37
	h *= xmix
	return h ^ h>>32
}

// seqHash is SeqHash: XXH3-64 with BaseSeed of LE64(parent) ‖ LE64(local).
func seqHash(parent, local uint64) uint64 {
	lo, hi := parent^seqFlipLo, local^seqFlipHi
	return xavalanche(16 + bits.ReverseBytes64(lo) + hi + xfold(lo, hi))
}

// blockKeys are the secret's words with a seed mixed in, as XXH3's 17-to-128-byte case uses
// them: even words plus the seed, odd ones minus it.
type blockKeys [8]uint64

func newBlockKeys(seed uint64) blockKeys {
	return blockKeys{
		xsecret00 + seed, xsecret08 - seed, xsecret16 + seed, xsecret24 - seed,
		xsecret32 + seed, xsecret40 - seed, xsecret48 + seed, xsecret56 - seed,
	}
}

// hash16 is XXH3-64 of the little-endian bytes of 16 token ids, with the seed k was made with.
func (k *blockKeys) hash16(t *[16]uint32) uint64 {
	w := func(i int) uint64 { return uint64(t[2*i]) | uint64(t[2*i+1])<<32 }
	acc := x64len
	acc += xfold(w(2)^k[4], w(3)^k[5])
	acc += xfold(w(4)^k[6], w(5)^k[7])
	acc += xfold(w(0)^k[0], w(1)^k[1])
	acc += xfold(w(6)^k[2], w(7)^k[3])
	return xavalanche(acc)
}
