package replica

import (
	"bytes"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/radix"
)

// seeds are messages of every op, in the shapes the router publishes.
func seeds() []*Msg {
	return []*Msg{
		{Op: OpBooked, Replica: "9f3c2a7be1d04c55", ID: "0b5c1c6e-9a43-4a8e-8f6e-2f0d1e3c4b5a", Model: "meta-llama/Llama-3.1-8B",
			Worker: radix.WorkerKey{ID: 7, Rank: 1}, Prefill: 1029, TTL: 300_000, Seqs: []uint64{1<<63 | 5, 42, 0, ^uint64(0)}},
		{Op: OpBooked, Replica: "a", ID: "r", Model: "m", TTL: 1}, // a prompt shorter than a block
		{Op: OpPrefillDone, Replica: "9f3c2a7be1d04c55", ID: "0b5c1c6e-9a43-4a8e-8f6e-2f0d1e3c4b5a"},
		{Op: OpCompleted, Replica: "replica-b", ID: strings.Repeat("x", 1024)},
		{Op: OpSession, Replica: "replica-b", ID: "session-1", Model: "m", Worker: radix.WorkerKey{ID: 3, Rank: 2}, TTL: 600_000},
	}
}

// TestSessionLayout pins a session binding's layout (SPEC.md, section 3).
func TestSessionLayout(t *testing.T) {
	m := &Msg{Op: OpSession, Replica: "AB", ID: "s1", Model: "m", Worker: radix.WorkerKey{ID: 0x0102, Rank: 3}, TTL: 1000}
	want := "4b565241" + "01" + "04" + "02" + "4142" + // magic, version, op, replica
		"0200" + "7331" + // session id
		"0100" + "6d" + // model
		"0201000000000000" + "03000000" + // worker, rank
		"e8030000" // ttl ms
	if got := hex.EncodeToString(Append(nil, m)); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestMsgLayout pins the byte layout SPEC.md gives, field by field.
func TestMsgLayout(t *testing.T) {
	m := &Msg{Op: OpBooked, Replica: "AB", ID: "r1", Model: "m", Worker: radix.WorkerKey{ID: 0x0102, Rank: 3},
		Prefill: 0x40, TTL: 1000, Seqs: []uint64{0x1122334455667788}}
	want := "4b565241" + "01" + "01" + "02" + "4142" + // magic, version, op, replica
		"0200" + "7231" + // request id
		"0100" + "6d" + // model
		"0201000000000000" + "03000000" + // worker, rank
		"4000000000000000" + "e8030000" + // prefill tokens, ttl ms
		"01000000" + "8877665544332211" // blocks
	if got := hex.EncodeToString(Append(nil, m)); got != want {
		t.Fatalf("booked:\n got %s\nwant %s", got, want)
	}
	c := &Msg{Op: OpCompleted, Replica: "AB", ID: "r1"}
	if got := hex.EncodeToString(Append(nil, c)); got != "4b565241"+"01"+"03"+"02"+"4142"+"0200"+"7231" {
		t.Fatalf("completed: %s", got)
	}
	// The sizes SPEC.md quotes.
	big := &Msg{Op: OpBooked, Replica: strings.Repeat("r", 16), ID: strings.Repeat("i", 36), Model: strings.Repeat("m", 30), TTL: 1, Seqs: make([]uint64, 128)}
	done := &Msg{Op: OpCompleted, Replica: big.Replica, ID: big.ID}
	if n, k := len(Append(nil, big)), len(Append(nil, done)); n != 1145 || k != 61 {
		t.Fatalf("sizes %d and %d, SPEC.md says 1145 and 61", n, k)
	}
}

func TestMsgRoundTrip(t *testing.T) {
	var m Msg
	for _, want := range seeds() {
		b := Append(nil, want)
		if err := Decode(b, &m); err != nil {
			t.Fatalf("%+v: %v", want, err)
		}
		if m.Op != want.Op || m.Replica != want.Replica || m.ID != want.ID || m.Model != want.Model ||
			m.Worker != want.Worker || m.Prefill != want.Prefill || m.TTL != want.TTL || !slices.Equal(m.Seqs, want.Seqs) {
			t.Fatalf("decoded %+v, want %+v", m, *want)
		}
		if !bytes.Equal(Append(nil, &m), b) {
			t.Fatal("re-encoded differently")
		}
	}
	b := Append(nil, seeds()[0])
	if n := testing.AllocsPerRun(100, func() { _ = Decode(b, &m) }); n != 0 {
		t.Fatalf("decoding allocates %v times", n)
	}
}

func TestDecodeErrors(t *testing.T) {
	good := Append(nil, seeds()[0])
	f := func(name string, b []byte, wantField string) {
		t.Helper()
		m := Msg{Seqs: []uint64{9}}
		err := Decode(b, &m)
		if !errors.Is(err, ErrMsg) || !strings.Contains(err.Error(), `"`+wantField+`"`) || !strings.Contains(err.Error(), "offset") {
			t.Fatalf("%s: got %v, want an error in field %q", name, err, wantField)
		}
		if m.Replica != "" || m.ID != "" || len(m.Seqs) != 0 {
			t.Fatalf("%s: a failed decode left %+v", name, m)
		}
	}
	patch := func(at int, v ...byte) []byte {
		b := slices.Clone(good)
		copy(b[at:], v)
		return b
	}
	f("empty", nil, "magic")
	f("magic", patch(0, 'X'), "magic")
	f("version", patch(4, 2), "version")
	f("op 0", patch(5, 0), "op")
	f("op 5", patch(5, 5), "op")
	session := Append(nil, &Msg{Op: OpSession, Replica: "r", ID: "s", Model: "m", TTL: 1})
	f("session without ttl", append(slices.Clone(session[:len(session)-4]), 0, 0, 0, 0), "ttl_ms")
	f("session truncated", session[:len(session)-1], "ttl_ms")
	f("no replica", patch(6, 0), "replica_length")
	f("long replica", patch(6, 65), "replica_length")
	f("replica past the end", good[:10], "replica")
	f("no id", patch(7+16, 0, 0), "request_id_length")
	f("long id", patch(7+16, 0x01, 0x04), "request_id_length") // 1025
	f("truncated", good[:len(good)-1], "block_hashes")
	f("trailing", append(slices.Clone(good), 0), "end")
	ttl := 7 + 16 + 2 + 36 + 2 + 23 + 8 + 4 + 8
	f("ttl 0", patch(ttl, 0, 0, 0, 0), "ttl_ms")
	f("huge count", patch(ttl+4, 0xff, 0xff, 0xff, 0xff), "blocks")
	f("count past the end", patch(ttl+4, 5), "block_hashes")
	done := Append(nil, seeds()[2])
	f("completion with a body", append(done, 1, 0, 'm'), "end")
}

// FuzzDecode checks that decoding arbitrary bytes never panics, that whatever decodes
// re-encodes to the same bytes, and that a value decoded into before does not change the result.
func FuzzDecode(f *testing.F) {
	for _, m := range seeds() {
		f.Add(Append(nil, m))
	}
	f.Add([]byte("KVRA\x01\x03"))
	prev := Append(nil, seeds()[0])
	f.Fuzz(func(t *testing.T, b []byte) {
		var fresh, reused Msg
		if err := Decode(prev, &reused); err != nil {
			t.Fatal(err)
		}
		err := Decode(b, &fresh)
		err2 := Decode(b, &reused)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("fresh: %v, reused: %v", err, err2)
		}
		if err != nil {
			if !errors.Is(err, ErrMsg) {
				t.Fatalf("error %v does not wrap ErrMsg", err)
			}
			return
		}
		if enc := Append(nil, &fresh); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded\n%x\nfrom\n%x", enc, b)
		}
		if enc := Append(nil, &reused); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded after reuse\n%x\nfrom\n%x", enc, b)
		}
	})
}
