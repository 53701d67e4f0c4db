package snapshot

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/zeebo/xxh3"
)

// Limits of the format; a manifest or stream beyond them is rejected.
const (
	// MaxChunk is the largest raw chunk Write accepts, in bytes.
	MaxChunk = 256 << 20
	// MaxChunks is the largest number of chunks in one snapshot.
	MaxChunks = 1 << 20
	// MaxInfo is the largest info header, in bytes.
	MaxInfo = 1 << 20
)

// Meta describes one snapshot: a plain value that its receiver owns, Info included.
type Meta struct {
	ID          uint64    // local to the store; increases with every Write and Receive
	Created     time.Time // when Write started (Receive keeps the sender's)
	StreamSeq   uint64    // the last event-stream sequence the state includes
	Chunks      int       // number of chunks
	RawBytes    int64     // sum of the chunks' uncompressed sizes
	StoredBytes int64     // sum of the chunks' compressed sizes
	Info        []byte    // the caller's opaque header
}

const (
	manifestMagic   = "KVSN"
	manifestVersion = 1
	manifestHead    = 56 // fixed part before info
	chunkEntrySize  = 16
)

// chunkEntry is one row of the manifest's chunk table.
type chunkEntry struct {
	raw, stored uint32
	sum         uint64
}

// storedBound is the largest stored size a chunk of raw bytes may have: zstd's worst case (raw
// blocks, 3 bytes of header per 128 KiB) plus a frame header, with margin.
func storedBound(raw uint32) uint64 { return uint64(raw) + uint64(raw)/1024 + 64 }

// manifestSize is the encoded size of a manifest with n chunks and an info of l bytes.
func manifestSize(n, l int) int { return manifestHead + l + chunkEntrySize*n + 8 }

// appendManifest appends the encoding of m and its chunk table to dst.
func appendManifest(dst []byte, m *Meta, chunks []chunkEntry) []byte {
	dst = append(dst, manifestMagic...)
	dst = binary.LittleEndian.AppendUint16(dst, manifestVersion)
	dst = binary.LittleEndian.AppendUint16(dst, 0)
	start := len(dst) - 8
	dst = binary.LittleEndian.AppendUint64(dst, m.ID)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(m.Created.UnixNano()))
	dst = binary.LittleEndian.AppendUint64(dst, m.StreamSeq)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(m.RawBytes))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(m.StoredBytes))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(chunks)))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(m.Info)))
	dst = append(dst, m.Info...)
	for _, c := range chunks {
		dst = binary.LittleEndian.AppendUint32(dst, c.raw)
		dst = binary.LittleEndian.AppendUint32(dst, c.stored)
		dst = binary.LittleEndian.AppendUint64(dst, c.sum)
	}
	return binary.LittleEndian.AppendUint64(dst, xxh3.Hash(dst[start:]))
}

// parseHead checks the fixed 56-byte head of a manifest and returns the chunk count and info
// length it announces. Errors name the field and its offset.
func parseHead(b []byte) (n, l int, err error) {
	if len(b) < manifestHead {
		return 0, 0, errorf("manifest", ErrTruncated, "need %d bytes of head, have %d", manifestHead, len(b))
	}
	if string(b[0:4]) != manifestMagic {
		return 0, 0, errorf(`manifest field "magic" at offset 0`, ErrFormat, "%q, want %q", b[0:4], manifestMagic)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != manifestVersion {
		return 0, 0, errorf(`manifest field "version" at offset 4`, ErrFormat, "%d, this reader reads %d", v, manifestVersion)
	}
	if f := binary.LittleEndian.Uint16(b[6:]); f != 0 {
		return 0, 0, errorf(`manifest field "flags" at offset 6`, ErrFormat, "%#x, want 0", f)
	}
	cn := binary.LittleEndian.Uint32(b[48:])
	if cn > MaxChunks {
		return 0, 0, errorf(`manifest field "chunk_count" at offset 48`, ErrFormat, "%d, limit %d", cn, MaxChunks)
	}
	il := binary.LittleEndian.Uint32(b[52:])
	if il > MaxInfo {
		return 0, 0, errorf(`manifest field "info_len" at offset 52`, ErrFormat, "%d, limit %d", il, MaxInfo)
	}
	return int(cn), int(il), nil
}

// decodeManifest checks and decodes a whole manifest. The returned Meta's Info aliases b.
func decodeManifest(b []byte) (Meta, []chunkEntry, error) {
	n, l, err := parseHead(b)
	if err != nil {
		return Meta{}, nil, err
	}
	size := manifestSize(n, l)
	if len(b) < size {
		return Meta{}, nil, errorf("manifest", ErrTruncated, "%d chunks and %d bytes of info need %d bytes, have %d", n, l, size, len(b))
	}
	if len(b) > size {
		return Meta{}, nil, errorf("manifest", ErrFormat, "%d trailing bytes at offset %d", len(b)-size, size)
	}
	if want, got := binary.LittleEndian.Uint64(b[size-8:]), xxh3.Hash(b[:size-8]); want != got {
		return Meta{}, nil, errorf(fmt.Sprintf(`manifest field "checksum" at offset %d`, size-8), ErrCorrupt, "stored %#016x, computed %#016x", want, got)
	}
	m := Meta{
		ID:          binary.LittleEndian.Uint64(b[8:]),
		Created:     time.Unix(0, int64(binary.LittleEndian.Uint64(b[16:]))),
		StreamSeq:   binary.LittleEndian.Uint64(b[24:]),
		RawBytes:    int64(binary.LittleEndian.Uint64(b[32:])),
		StoredBytes: int64(binary.LittleEndian.Uint64(b[40:])),
		Chunks:      n,
		Info:        b[manifestHead : manifestHead+l : manifestHead+l],
	}
	chunks := make([]chunkEntry, n)
	var raw, stored uint64
	off := manifestHead + l
	for i := range chunks {
		c := chunkEntry{
			raw:    binary.LittleEndian.Uint32(b[off:]),
			stored: binary.LittleEndian.Uint32(b[off+4:]),
			sum:    binary.LittleEndian.Uint64(b[off+8:]),
		}
		if c.raw > MaxChunk {
			return Meta{}, nil, errorf(fmt.Sprintf(`manifest field "chunks[%d].raw_len" at offset %d`, i, off), ErrFormat, "%d, limit %d", c.raw, MaxChunk)
		}
		if uint64(c.stored) > storedBound(c.raw) {
			return Meta{}, nil, errorf(fmt.Sprintf(`manifest field "chunks[%d].stored_len" at offset %d`, i, off+4), ErrFormat, "%d for %d raw bytes, limit %d", c.stored, c.raw, storedBound(c.raw))
		}
		raw += uint64(c.raw)
		stored += uint64(c.stored)
		chunks[i] = c
		off += chunkEntrySize
	}
	if raw != uint64(m.RawBytes) {
		return Meta{}, nil, errorf(`manifest field "raw_bytes" at offset 32`, ErrFormat, "%d, chunks sum to %d", uint64(m.RawBytes), raw)
	}
	if stored != uint64(m.StoredBytes) {
		return Meta{}, nil, errorf(`manifest field "stored_bytes" at offset 40`, ErrFormat, "%d, chunks sum to %d", uint64(m.StoredBytes), stored)
	}
	return m, chunks, nil
}

// Keys; see doc.go.
const (
	kindFormat   = 0x00
	kindManifest = 0x01
	kindPending  = 0x02
	kindChunk    = 0x03

	formatValue = "kvrouterd.snapshot/1"
)

var formatKey = []byte("\x00format")

func idKey(kind byte, id uint64) []byte {
	k := make([]byte, 9)
	k[0] = kind
	binary.BigEndian.PutUint64(k[1:], id)
	return k
}

// chunkKeySize is the length of a chunk key: kind, ID, index.
const chunkKeySize = 1 + 8 + 4

// chunkKey appends the key of chunk i of snapshot id to dst.
func chunkKey(dst []byte, id uint64, i int) []byte {
	dst = append(dst, kindChunk)
	dst = binary.BigEndian.AppendUint64(dst, id)
	return binary.BigEndian.AppendUint32(dst, uint32(i))
}

// keyID returns the ID of a 9-byte manifest or pending key.
func keyID(k []byte) (uint64, bool) {
	if len(k) != 9 {
		return 0, false
	}
	return binary.BigEndian.Uint64(k[1:]), true
}
