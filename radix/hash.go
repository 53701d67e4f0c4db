package radix

import (
	"encoding/binary"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// BaseSeed is the XXH3-64 seed of blocks of the base model (no LoRA adapter).
const BaseSeed uint64 = 1337

// LoRASeed returns the seed for blocks computed under the named LoRA adapter: BaseSeed plus the
// unseeded XXH3-64 of the name, wrapping. The empty name is the base model.
func LoRASeed(name string) uint64 {
	if name == "" {
		return BaseSeed
	}
	return BaseSeed + xxh3.HashString(name)
}

// Seed returns the seed for blocks computed under the named LoRA adapter and cache salt, as
// Dynamo computes it: LoRASeed(lora) plus, for a salt that is not empty, the XXH3-64 of the
// salt with seed 1, wrapping. The salt changes every block's local hash alike; the chain of
// sequence hashes keeps BaseSeed.
func Seed(lora, salt string) uint64 {
	s := LoRASeed(lora)
	if salt != "" {
		s += xxh3.HashStringSeed(salt, 1)
	}
	return s
}

// SeqHash chains one local block hash onto the sequence hash of its parent:
// XXH3-64 with BaseSeed over LE64(parent) ‖ LE64(local). The first block of a chain has no parent
// and its sequence hash is its local hash.
func SeqHash(parent, local uint64) uint64 {
	return seqHash(parent, local)
}

// ChainInPlace turns local block hashes into sequence hashes in place. When hasParent is set the
// first block chains onto parent (the sequence hash of the block before it); otherwise it is the
// root of its chain.
func ChainInPlace(hashes []uint64, parent uint64, hasParent bool) {
	if len(hashes) == 0 {
		return
	}
	if !hasParent {
		parent, hashes = hashes[0], hashes[1:]
	}
	for i, l := range hashes {
		parent = seqHash(parent, l)
		hashes[i] = parent
	}
}

// nativeLE reports whether a []uint32 already has the little-endian byte layout the hash is
// defined over, so that token ids can be hashed in place without copying.
var nativeLE = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// Hasher computes block hashes. Its zero value is ready; it keeps scratch space so that repeated
// calls allocate nothing. A Hasher is for one goroutine at a time.
type Hasher struct {
	buf []byte   // token (and multimodal) bytes when they cannot be hashed in place
	mm  []uint64 // sorted copy of one block's multimodal hashes
	// forceCopy makes the hasher take the portable copying path (tests use it on little-endian
	// machines so both paths stay covered).
	forceCopy bool
}

// AppendLocal appends the local hash of every full block of tokens to dst and returns the
// extended slice. A partial tail block is ignored. blockSize must be positive.
func (h *Hasher) AppendLocal(dst []uint64, tokens []uint32, blockSize int, seed uint64) []uint64 {
	if blockSize == 16 {
		// The ids are read as words (xxh3.go), whatever the machine's byte order: no copy.
		k := newBlockKeys(seed)
		dst = slices.Grow(dst, len(tokens)/16)
		for len(tokens) >= 16 {
			dst = append(dst, k.hash16((*[16]uint32)(tokens)))
			tokens = tokens[16:]
		}
		return dst
	}
	for len(tokens) >= blockSize {
		dst = append(dst, xxh3.HashSeed(h.tokenBytes(tokens[:blockSize]), seed))
		tokens = tokens[blockSize:]
	}
	return dst
}

// AppendLocalMM is AppendLocal for blocks that carry multimodal object hashes: mm[i] holds the
// hashes of block i (nil or empty for a block without any); blocks past len(mm) have none. A
// block's hashed bytes are its token bytes followed by its mm hashes, sorted ascending, each as a
// little-endian u64.
func (h *Hasher) AppendLocalMM(dst []uint64, tokens []uint32, blockSize int, seed uint64, mm [][]uint64) []uint64 {
	for i := 0; len(tokens) >= blockSize; i++ {
		block := tokens[:blockSize]
		tokens = tokens[blockSize:]
		if i >= len(mm) || len(mm[i]) == 0 {
			dst = append(dst, xxh3.HashSeed(h.tokenBytes(block), seed))
			continue
		}
		h.mm = append(h.mm[:0], mm[i]...)
		slices.Sort(h.mm)
		h.buf = appendTokens(h.buf[:0], block)
		for _, x := range h.mm {
			h.buf = binary.LittleEndian.AppendUint64(h.buf, x)
		}
		dst = append(dst, xxh3.HashSeed(h.buf, seed))
	}
	return dst
}

// AppendSequence appends the sequence hashes of the full blocks of tokens (a request's prompt,
// chained from the root) to dst.
func (h *Hasher) AppendSequence(dst []uint64, tokens []uint32, blockSize int, seed uint64) []uint64 {
	if blockSize == 16 && len(tokens) >= 16 {
		// One pass: a block's local hash is computed while its parent's chaining completes.
		k := newBlockKeys(seed)
		dst = slices.Grow(dst, len(tokens)/16)
		parent := k.hash16((*[16]uint32)(tokens))
		dst = append(dst, parent)
		for tokens = tokens[16:]; len(tokens) >= 16; tokens = tokens[16:] {
			parent = seqHash(parent, k.hash16((*[16]uint32)(tokens)))
			dst = append(dst, parent)
		}
		return dst
	}
	n := len(dst)
	dst = h.AppendLocal(dst, tokens, blockSize, seed)
	ChainInPlace(dst[n:], 0, false)
	return dst
}

// tokenBytes returns the little-endian bytes of tokens, in place when the machine allows.
func (h *Hasher) tokenBytes(tokens []uint32) []byte {
	if nativeLE && !h.forceCopy {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens))
	}
	h.buf = appendTokens(h.buf[:0], tokens)
	return h.buf
}

func appendTokens(dst []byte, tokens []uint32) []byte {
	for _, t := range tokens {
		dst = binary.LittleEndian.AppendUint32(dst, t)
	}
	return dst
}
