package replica_test

import (
	"fmt"
	"strings"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/replica"
)

// specBooking is the booking of SPEC.md's worked example: replica east-1 routed request req-7,
// a prompt of the 40 token ids 0 to 39, to worker 7 rank 1 of model llama (blocks of 16,
// nothing cached), for the router's default 300 s.
func specBooking() *replica.Msg {
	tokens := make([]uint32, 40)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	var h radix.Hasher
	return &replica.Msg{Op: replica.OpBooked, Replica: "east-1", ID: "req-7", Model: "llama",
		Worker: radix.WorkerKey{ID: 7, Rank: 1}, Prefill: 40, TTL: 300_000,
		Seqs: h.AppendSequence(nil, tokens, 16, radix.BaseSeed)}
}

// specCompletion is the completion of the same request.
func specCompletion() *replica.Msg {
	return &replica.Msg{Op: replica.OpCompleted, Replica: "east-1", ID: "req-7"}
}

// hexDump writes b as SPEC.md shows messages: the offset in hex, then 16 bytes a line.
func hexDump(b []byte) string {
	var s strings.Builder
	for i := 0; i < len(b); i += 16 {
		fmt.Fprintf(&s, "%04x ", i)
		for _, c := range b[i:min(i+16, len(b))] {
			fmt.Fprintf(&s, " %02x", c)
		}
		s.WriteByte('\n')
	}
	return s.String()
}

// The messages of SPEC.md's worked example, as the encoder writes them.
func ExampleAppend() {
	b := replica.Append(nil, specBooking())
	fmt.Printf("booked, %d bytes:\n%s", len(b), hexDump(b))
	c := replica.Append(nil, specCompletion())
	fmt.Printf("completed, %d bytes:\n%s", len(c), hexDump(c))
	// Output:
	// booked, 71 bytes:
	// 0000  4b 56 52 41 01 01 06 65 61 73 74 2d 31 05 00 72
	// 0010  65 71 2d 37 05 00 6c 6c 61 6d 61 07 00 00 00 00
	// 0020  00 00 00 01 00 00 00 28 00 00 00 00 00 00 00 e0
	// 0030  93 04 00 02 00 00 00 8a 32 33 c8 41 8f 7a d4 38
	// 0040  7f 44 16 fb df 15 bf
	// completed, 20 bytes:
	// 0000  4b 56 52 41 01 03 06 65 61 73 74 2d 31 05 00 72
	// 0010  65 71 2d 37
}

// A receiver decodes into one Msg, message after message; a malformed message's error names
// the field and its offset.
func ExampleDecode() {
	b := replica.Append(nil, specBooking())
	var m replica.Msg
	if err := replica.Decode(b, &m); err != nil {
		panic(err)
	}
	fmt.Printf("op %d from %s: request %s of model %s on worker %d rank %d, %d prefill tokens, %d blocks, ttl %d ms\n",
		m.Op, m.Replica, m.ID, m.Model, m.Worker.ID, m.Worker.Rank, m.Prefill, len(m.Seqs), m.TTL)
	copy(b[47:], []byte{0, 0, 0, 0}) // ttl_ms
	fmt.Println(replica.Decode(b, &m))
	// Output:
	// op 1 from east-1: request req-7 of model llama on worker 7 rank 1, 40 prefill tokens, 2 blocks, ttl 300000 ms
	// replica: malformed load-share message: field "ttl_ms" at offset 47: must be at least 1
}
