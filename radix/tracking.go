package radix

// Keyed tracking hashes: the identities under which a router books a request's blocks as
// active (Dynamo's --router-tracking-hash keyed-xxh3-v1). The index keeps its public hashes;
// only the active-sequence identities depend on a provider's secret key, so that whoever can
// compute public hashes cannot compute them, and routers configured with different keys share
// none. Byte-compatible with Dynamo's lib/kv-router tracking_hash.rs, so that kvrouterd and
// Dynamo replicas given the same key and key id book the same identities.

import (
	"encoding/binary"
	"errors"

	"github.com/zeebo/xxh3"
	"lukechampine.com/blake3"
)

// TrackingKeySize is the size of a tracking key, in bytes.
const TrackingKeySize = 32

// trackingDomain separates the keyed-xxh3-v1 derivation from any other use of the key.
const trackingDomain = "dynamo.router.tracking-hash/keyed-xxh3-v1\x00"

// ErrTrackingKey is returned for a tracking key or key id that cannot be used.
var ErrTrackingKey = errors.New("radix: tracking key")

// TrackingKey is a provider's key and its epoch (key id). A plain value, read-only once made;
// safe for concurrent use.
type TrackingKey struct {
	key [TrackingKeySize]byte
	id  string
}

// NewTrackingKey returns the key of exactly TrackingKeySize raw bytes under key id, which must
// be non-empty and without surrounding blanks (Dynamo's rule).
func NewTrackingKey(key []byte, id string) (*TrackingKey, error) {
	if len(key) != TrackingKeySize {
		return nil, errors.Join(ErrTrackingKey, errors.New("the key must be exactly 32 raw bytes"))
	}
	if id == "" || trimmed(id) != id {
		return nil, errors.Join(ErrTrackingKey, errors.New("the key id must be non-empty, without leading or trailing whitespace"))
	}
	k := &TrackingKey{id: id}
	copy(k.key[:], key)
	return k, nil
}

func trimmed(s string) string {
	blank := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' }
	for len(s) > 0 && blank(s[0]) {
		s = s[1:]
	}
	for len(s) > 0 && blank(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}

// ID returns the key id.
func (k *TrackingKey) ID() string { return k.id }

// TrackingScope is what a request's tracking identities depend on besides its tokens.
type TrackingScope struct {
	Model, Group string // the routing partition: model name and routing group
	BlockSize    int
	Salt, LoRA   string // cache salt and LoRA adapter ("" for none)
}

// Seeds derives the scope's block and chain seeds: the first 16 bytes of the BLAKE3 keyed hash
// of the domain and the scope's fields, each framed by a tag and its length.
func (k *TrackingKey) Seeds(sc TrackingScope) (block, chain uint64) {
	h := blake3.New(32, k.key[:])
	var b [9]byte
	frame := func(tag byte, v []byte) {
		b[0] = tag
		binary.LittleEndian.PutUint64(b[1:], uint64(len(v)))
		h.Write(b[:])
		h.Write(v)
	}
	optional := func(tag byte, v string) {
		if v == "" {
			h.Write([]byte{tag, 0})
			return
		}
		h.Write([]byte{tag, 1})
		binary.LittleEndian.PutUint64(b[1:], uint64(len(v)))
		h.Write(b[1:])
		h.Write([]byte(v))
	}
	h.Write([]byte(trackingDomain))
	frame(1, []byte(k.id))
	frame(2, []byte(sc.Model))
	frame(3, []byte(sc.Group))
	frame(4, binary.LittleEndian.AppendUint32(nil, uint32(sc.BlockSize)))
	optional(5, sc.Salt)
	optional(6, sc.LoRA)
	frame(7, []byte{0}) // Eagle windows: kvrouterd hashes plain blocks
	var out [32]byte
	sum := h.Sum(out[:0])
	return binary.LittleEndian.Uint64(sum[:8]), binary.LittleEndian.Uint64(sum[8:16])
}

// AppendTracking appends the keyed tracking identities of the full blocks of tokens to dst:
// each block's bytes hashed with XXH3-64 under blockSeed, the first block's hash its identity,
// each later one chained onto its parent's as XXH3-64 under chainSeed of LE64(parent) ‖
// LE64(block). The scope's LoRA and salt enter through the seeds, not the block seed's base.
func (h *Hasher) AppendTracking(dst []uint64, tokens []uint32, blockSize int, blockSeed, chainSeed uint64) []uint64 {
	n := len(dst)
	dst = h.AppendLocal(dst, tokens, blockSize, blockSeed)
	if len(dst) == n {
		return dst
	}
	var pair [16]byte
	parent := dst[n]
	for i := n + 1; i < len(dst); i++ {
		binary.LittleEndian.PutUint64(pair[:8], parent)
		binary.LittleEndian.PutUint64(pair[8:], dst[i])
		parent = xxh3.HashSeed(pair[:], chainSeed)
		dst[i] = parent
	}
	return dst
}
