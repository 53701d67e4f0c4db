// Package blake3 is BLAKE3's keyed hash (the BLAKE3 paper, its reference algorithm) with a
// 32-byte output, for deriving seeds from a secret key: Dynamo's keyed tracking hashes
// (radix.TrackingSeeds) derive theirs this way, so kvrouterd must produce the same bytes. It is
// the portable one-block-at-a-time form, for short inputs hashed once per request scope, not
// a bulk hasher. A Hasher is for one goroutine at a time.
package blake3

import (
	"encoding/binary"
	"math/bits"
)

const (
	chunkLen   = 1024
	blockLen   = 64
	chunkStart = 1 << 0
	chunkEnd   = 1 << 1
	parent     = 1 << 2
	root       = 1 << 3
	keyedHash  = 1 << 4
)

var iv = [8]uint32{0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19}

var perm = [16]int{2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8}

func g(s *[16]uint32, a, b, c, d int, mx, my uint32) {
	s[a] += s[b] + mx
	s[d] = bits.RotateLeft32(s[d]^s[a], -16)
	s[c] += s[d]
	s[b] = bits.RotateLeft32(s[b]^s[c], -12)
	s[a] += s[b] + my
	s[d] = bits.RotateLeft32(s[d]^s[a], -8)
	s[c] += s[d]
	s[b] = bits.RotateLeft32(s[b]^s[c], -7)
}

// compress is BLAKE3's compression function; it returns the first 8 words of its output,
// which are both a chaining value and, with the root flag, the first 32 bytes of the hash.
func compress(cv *[8]uint32, block *[16]uint32, counter uint64, n uint32, flags uint32) [8]uint32 {
	s := [16]uint32{cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7],
		iv[0], iv[1], iv[2], iv[3], uint32(counter), uint32(counter >> 32), n, flags}
	m := *block
	for r := 0; r < 7; r++ {
		g(&s, 0, 4, 8, 12, m[0], m[1])
		g(&s, 1, 5, 9, 13, m[2], m[3])
		g(&s, 2, 6, 10, 14, m[4], m[5])
		g(&s, 3, 7, 11, 15, m[6], m[7])
		g(&s, 0, 5, 10, 15, m[8], m[9])
		g(&s, 1, 6, 11, 12, m[10], m[11])
		g(&s, 2, 7, 8, 13, m[12], m[13])
		g(&s, 3, 4, 9, 14, m[14], m[15])
		if r < 6 {
			var p [16]uint32
			for i, j := range perm {
				p[i] = m[j]
			}
			m = p
		}
	}
	var out [8]uint32
	for i := range out {
		out[i] = s[i] ^ s[i+8]
	}
	return out
}

// Hasher is BLAKE3 keyed by a 32-byte key; its zero value is not ready: use New.
type Hasher struct {
	key   [8]uint32
	cv    [8]uint32 // the current chunk's chaining value
	chunk uint64    // the current chunk's index
	buf   [blockLen]byte
	nbuf  int // bytes in buf
	nblk  int // blocks of the current chunk compressed
	stack [][8]uint32
}

// New returns a Hasher keyed by key.
func New(key *[32]byte) *Hasher {
	h := &Hasher{}
	for i := range h.key {
		h.key[i] = binary.LittleEndian.Uint32(key[4*i:])
	}
	h.cv = h.key
	return h
}

func words(b *[blockLen]byte) *[16]uint32 {
	var w [16]uint32
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return &w
}

func (h *Hasher) startFlag() uint32 {
	if h.nblk == 0 {
		return chunkStart
	}
	return 0
}

// Write adds p to the input; it never fails.
func (h *Hasher) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if h.nbuf == blockLen {
			// A full block with more input after it is never the chunk's last one, unless
			// the chunk is full: then the chunk ends, and its value joins the tree.
			if h.nblk == chunkLen/blockLen-1 {
				cv := compress(&h.cv, words(&h.buf), h.chunk, blockLen, keyedHash|h.startFlag()|chunkEnd)
				h.push(cv)
				h.chunk++
				h.cv, h.nblk = h.key, 0
			} else {
				h.cv = compress(&h.cv, words(&h.buf), h.chunk, blockLen, keyedHash|h.startFlag())
				h.nblk++
			}
			h.nbuf = 0
		}
		c := copy(h.buf[h.nbuf:], p)
		h.nbuf += c
		p = p[c:]
	}
	return n, nil
}

// push adds a finished chunk's chaining value to the tree, merging the subtrees it completes.
func (h *Hasher) push(cv [8]uint32) {
	for total := h.chunk + 1; total&1 == 0; total >>= 1 {
		cv = h.parentCV(h.stack[len(h.stack)-1], cv, 0)
		h.stack = h.stack[:len(h.stack)-1]
	}
	h.stack = append(h.stack, cv)
}

func (h *Hasher) parentCV(l, r [8]uint32, flags uint32) [8]uint32 {
	var b [16]uint32
	copy(b[:8], l[:])
	copy(b[8:], r[:])
	return compress(&h.key, &b, 0, blockLen, keyedHash|parent|flags)
}

// Sum returns the 32-byte hash of what was written; h is unchanged.
func (h *Hasher) Sum() [32]byte {
	var last [blockLen]byte
	copy(last[:], h.buf[:h.nbuf])
	flags := uint32(keyedHash | h.startFlag() | chunkEnd)
	var out [8]uint32
	if len(h.stack) == 0 {
		out = compress(&h.cv, words(&last), h.chunk, uint32(h.nbuf), flags|root)
	} else {
		cv := compress(&h.cv, words(&last), h.chunk, uint32(h.nbuf), flags)
		for i := len(h.stack) - 1; i >= 0; i-- {
			f := uint32(0)
			if i == 0 {
				f = root
			}
			cv = h.parentCV(h.stack[i], cv, f)
		}
		out = cv
	}
	var sum [32]byte
	for i, w := range out {
		binary.LittleEndian.PutUint32(sum[4*i:], w)
	}
	return sum
}
