package replica

// The load-share message: one operation each, laid out, limited and checked as SPEC.md says
// (sections 3 to 5), whose worked example the tests hold to Append and Decode.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
)

// Op is the operation of a load-share message.
type Op uint8

// Operations of load-share messages.
const (
	OpBooked      Op = 1
	OpPrefillDone Op = 2
	OpCompleted   Op = 3
	// OpSession binds a session to a worker (session affinity); its ID is the session id.
	OpSession Op = 4
)

// Limits of load-share messages.
const (
	version   = 1
	maxString = 1024
	// MaxBlocks bounds the blocks of a booking: a prompt of router.MaxTokens tokens in
	// blocks of one.
	MaxBlocks = router.MaxTokens
)

var magic = [4]byte{'K', 'V', 'R', 'A'}

// ErrMsg is what every load-share decode error wraps.
var ErrMsg = errors.New("replica: malformed load-share message")

// Msg is one load-share message (SPEC.md, section 3); a value belongs to one goroutine. After
// Decode its strings alias the decoded buffer and Seqs reuses its own array: valid until the
// next decode into it.
type Msg struct {
	Op      Op
	Replica string
	ID      string
	// Booked and session only:
	Model  string
	Worker radix.WorkerKey
	TTL    uint32 // milliseconds
	// Booked only:
	Prefill uint64
	Seqs    []uint64
}

// Append appends m's encoding to dst. Fields beyond their limits are the caller's error:
// the message will not decode.
func Append(dst []byte, m *Msg) []byte {
	dst = append(dst, magic[:]...)
	dst = append(dst, version, byte(m.Op), byte(len(m.Replica)))
	dst = append(dst, m.Replica...)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(m.ID)))
	dst = append(dst, m.ID...)
	if m.Op == OpSession {
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(m.Model)))
		dst = append(dst, m.Model...)
		dst = binary.LittleEndian.AppendUint64(dst, m.Worker.ID)
		dst = binary.LittleEndian.AppendUint32(dst, m.Worker.Rank)
		return binary.LittleEndian.AppendUint32(dst, m.TTL)
	}
	if m.Op != OpBooked {
		return dst
	}
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(m.Model)))
	dst = append(dst, m.Model...)
	dst = binary.LittleEndian.AppendUint64(dst, m.Worker.ID)
	dst = binary.LittleEndian.AppendUint32(dst, m.Worker.Rank)
	dst = binary.LittleEndian.AppendUint64(dst, m.Prefill)
	dst = binary.LittleEndian.AppendUint32(dst, m.TTL)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(m.Seqs)))
	for _, s := range m.Seqs {
		dst = binary.LittleEndian.AppendUint64(dst, s)
	}
	return dst
}

// decoder reads a message front to back; the first error sticks. at is the offset of the
// field read last, for the error.
type decoder struct {
	b       []byte
	off, at int
	err     error
}

// fail records an error in the field read last.
func (d *decoder) fail(field, format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: field %q at offset %d: %s", ErrMsg, field, d.at, fmt.Sprintf(format, args...))
	}
}

// take returns the next n bytes of field, or nil once anything failed.
func (d *decoder) take(field string, n int) []byte {
	if d.err != nil {
		return nil
	}
	d.at = d.off
	if len(d.b)-d.off < n {
		d.fail(field, "truncated: need %d bytes, have %d", n, len(d.b)-d.off)
		return nil
	}
	d.off += n
	return d.b[d.at:d.off:d.off]
}

func (d *decoder) u8(field string) uint8 {
	if b := d.take(field, 1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u16(field string) uint16 {
	if b := d.take(field, 2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32(field string) uint32 {
	if b := d.take(field, 4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64(field string) uint64 {
	if b := d.take(field, 8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// str reads a string of n bytes, 1..max (n was read last, as field's length), aliasing the
// buffer.
func (d *decoder) str(field string, n, max int) string {
	if d.err == nil && (n < 1 || n > max) {
		d.fail(field+"_length", "%d, want 1 to %d", n, max)
	}
	if b := d.take(field, n); len(b) > 0 {
		return unsafe.String(&b[0], len(b))
	}
	return ""
}

// Decode decodes a load-share message into m. Errors wrap ErrMsg and name the field
// and its byte offset. It allocates only to grow m.Seqs.
func Decode(b []byte, m *Msg) error {
	d := decoder{b: b}
	if mg := d.take("magic", 4); mg != nil && [4]byte(mg) != magic {
		d.fail("magic", "%q, want %q", mg, magic[:])
	}
	if v := d.u8("version"); d.err == nil && v != version {
		d.fail("version", "%d, want %d", v, version)
	}
	m.Op = Op(d.u8("op"))
	if d.err == nil && (m.Op < OpBooked || m.Op > OpSession) {
		d.fail("op", "unknown op %d", m.Op)
	}
	m.Replica = d.str("replica", int(d.u8("replica_length")), router.MaxReplicaID)
	m.ID = d.str("request_id", int(d.u16("request_id_length")), maxString)
	m.Model, m.Worker, m.Prefill, m.TTL, m.Seqs = "", radix.WorkerKey{}, 0, 0, m.Seqs[:0]
	if m.Op == OpSession {
		m.Model = d.str("model", int(d.u16("model_length")), maxString)
		m.Worker.ID = d.u64("worker")
		m.Worker.Rank = d.u32("dp_rank")
		if m.TTL = d.u32("ttl_ms"); d.err == nil && m.TTL == 0 {
			d.fail("ttl_ms", "must be at least 1")
		}
	}
	if m.Op == OpBooked {
		m.Model = d.str("model", int(d.u16("model_length")), maxString)
		m.Worker.ID = d.u64("worker")
		m.Worker.Rank = d.u32("dp_rank")
		m.Prefill = d.u64("prefill_tokens")
		if m.TTL = d.u32("ttl_ms"); d.err == nil && m.TTL == 0 {
			d.fail("ttl_ms", "must be at least 1")
		}
		n := int(d.u32("blocks"))
		if d.err == nil && n > MaxBlocks {
			d.fail("blocks", "%d, at most %d", n, MaxBlocks)
		}
		if hs := d.take("block_hashes", 8*n); hs != nil {
			for i := range n {
				m.Seqs = append(m.Seqs, binary.LittleEndian.Uint64(hs[8*i:]))
			}
		}
	}
	if d.err == nil && d.off != len(b) {
		d.at = d.off
		d.fail("end", "%d trailing bytes", len(b)-d.off)
	}
	if d.err != nil {
		m.Op, m.Replica, m.ID, m.Model, m.Seqs = 0, "", "", "", m.Seqs[:0]
	}
	return d.err
}
