package wire_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

var goldenSnapshotWorker = wire.SnapshotWorker{
	ID: 7, Model: "m", BlockSize: 16, Capacity: 1000, Endpoint: "tcp://h:5557", Reports: true,
	Ranks: []wire.SnapshotRank{
		{Rank: 0, Cursor: 9, Seqs: []uint64{1, 2}, Engines: []uint64{0xaa, 0xbb}},
		{Rank: 1, Seqs: []uint64{}, Engines: []uint64{}},
	},
}

// same compares two workers by value (nil and empty slices alike).
func sameWorker(a, b *wire.SnapshotWorker) bool {
	if a.ID != b.ID || a.Model != b.Model || a.BlockSize != b.BlockSize || a.Capacity != b.Capacity ||
		a.MaxTokens != b.MaxTokens || a.Endpoint != b.Endpoint || a.Replay != b.Replay ||
		a.Reports != b.Reports || a.HTTPEndpoint != b.HTTPEndpoint || a.APIKey != b.APIKey || a.Weight != b.Weight || a.Role != b.Role || len(a.Ranks) != len(b.Ranks) || !slices.Equal(a.Endpoints, b.Endpoints) {
		return false
	}
	for i := range a.Ranks {
		x, y := a.Ranks[i], b.Ranks[i]
		if x.Rank != y.Rank || x.Cursor != y.Cursor || x.Batch != y.Batch || len(x.Seqs) != len(y.Seqs) ||
			len(x.Seqs) > 0 && (!reflect.DeepEqual(x.Seqs, y.Seqs) || !reflect.DeepEqual(x.Engines, y.Engines)) ||
			len(x.Locals) != len(y.Locals) || len(x.Locals) > 0 && (!slices.Equal(x.Locals, y.Locals) || !slices.Equal(x.Parents, y.Parents)) ||
			len(x.Lower) != len(y.Lower) {
			return false
		}
		for j := range x.Lower {
			l, m := x.Lower[j], y.Lower[j]
			if l.Tier != m.Tier || !slices.Equal(l.Seqs, m.Seqs) || !slices.Equal(l.Engines, m.Engines) ||
				!slices.Equal(l.Locals, m.Locals) || !slices.Equal(l.Parents, m.Parents) {
				return false
			}
		}
	}
	return true
}

func TestSnapshotWorkerGolden(t *testing.T) {
	want := readHex(t, "snapshot_worker.hex")
	if err := goldenSnapshotWorker.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := wire.AppendSnapshotWorker(nil, &goldenSnapshotWorker); !bytes.Equal(got, want) {
		t.Fatalf("encoded\n%x\nwant\n%x", got, want)
	}
	var w wire.SnapshotWorker
	if err := wire.DecodeSnapshotWorker(want, &w); err != nil {
		t.Fatal(err)
	}
	if !sameWorker(&w, &goldenSnapshotWorker) {
		t.Fatalf("decoded %+v", w)
	}
	if typ, n, err := wire.ParseHeader(want); err != nil || typ != wire.TypeSnapshotWorker || n != len(want)-wire.HeaderSize {
		t.Fatalf("ParseHeader: %v %d %v", typ, n, err)
	}
}

func randSnapshotWorker(r *rand.Rand) *wire.SnapshotWorker {
	w := &wire.SnapshotWorker{ID: r.Uint64(), Model: "model-" + strings.Repeat("x", r.IntN(20)), BlockSize: 1 + r.IntN(64),
		Capacity: r.Int64N(1 << 40), MaxTokens: r.Int64N(1 << 20), Reports: r.IntN(2) == 0}
	switch r.IntN(3) {
	case 0: // as snapshots before per-rank endpoints
		w.Endpoint, w.Replay = "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558"
	case 1:
		w.Endpoints = []wire.SnapshotEndpoint{}
	}
	if r.IntN(2) == 0 {
		w.HTTPEndpoint = fmt.Sprintf("http://10.0.0.1:%d", 8000+r.IntN(100))
	}
	if r.IntN(2) == 0 {
		w.Weight = 0.125 + r.Float64()*8
	}
	w.Role = uint8(r.IntN(3))
	if r.IntN(2) == 0 {
		w.APIKey = fmt.Sprintf("sk-%016x", r.Uint64())
	}
	for rank := range r.IntN(4) {
		if w.Endpoints != nil {
			w.Endpoints = append(w.Endpoints, wire.SnapshotEndpoint{Endpoint: fmt.Sprintf("tcp://10.0.0.1:%d", 5557+rank)})
			if rank%2 == 0 {
				w.Endpoints[rank].Replay = fmt.Sprintf("tcp://10.0.0.1:%d", 6557+rank)
			}
		}
		n := r.IntN(300)
		sr := wire.SnapshotRank{Rank: uint32(rank * 3), Cursor: r.Uint64(), Seqs: make([]uint64, n), Engines: make([]uint64, n)}
		for j := range n {
			sr.Seqs[j], sr.Engines[j] = r.Uint64(), r.Uint64()
		}
		if w.Endpoints != nil {
			sr.Batch = r.Uint64N(3) * r.Uint64() // the rank's last engine batch, 0 for none
		}
		tree := r.IntN(3) == 0
		if tree { // the block tree of --keep-block-tree
			sr.Locals, sr.Parents = make([]uint64, n), make([]uint64, n)
			for j := range n {
				sr.Locals[j], sr.Parents[j] = r.Uint64(), r.Uint64()
			}
		}
		if r.IntN(2) == 0 { // blocks in lower storage tiers, some of them
			for _, tier := range []kvevent.Tier{kvevent.Host, kvevent.Disk, kvevent.External} {
				if r.IntN(2) == 0 {
					continue
				}
				n := r.IntN(50)
				l := kvevent.TierBlocks{Tier: tier, Seqs: make([]uint64, n), Engines: make([]uint64, n)}
				for j := range n {
					l.Seqs[j], l.Engines[j] = r.Uint64(), r.Uint64()
				}
				if tree && r.IntN(2) == 0 {
					l.Locals, l.Parents = make([]uint64, n), make([]uint64, n)
					for j := range n {
						l.Locals[j], l.Parents[j] = r.Uint64(), r.Uint64()
					}
				}
				sr.Lower = append(sr.Lower, l)
			}
		}
		w.Ranks = append(w.Ranks, sr)
	}
	return w
}

func TestSnapshotWorkerRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var got wire.SnapshotWorker // reused: decoding must not leak the previous worker's state
	var chunk []byte
	var ws []*wire.SnapshotWorker
	for range 200 {
		w := randSnapshotWorker(r)
		if err := w.Validate(); err != nil {
			t.Fatal(err)
		}
		b := wire.AppendSnapshotWorker(nil, w)
		if err := wire.DecodeSnapshotWorker(b, &got); err != nil {
			t.Fatal(err)
		}
		if !sameWorker(&got, w) {
			t.Fatalf("round trip changed %+v into %+v", w, got)
		}
		chunk = append(chunk, b...)
		ws = append(ws, w)
	}
	// A chunk is messages back to back: ParseHeader walks it.
	for i := 0; len(chunk) > 0; i++ {
		_, n, err := wire.ParseHeader(chunk)
		if err != nil {
			t.Fatal(err)
		}
		if err := wire.DecodeSnapshotWorker(chunk[:wire.HeaderSize+n], &got); err != nil || !sameWorker(&got, ws[i]) {
			t.Fatalf("message %d of the chunk: %v", i, err)
		}
		chunk = chunk[wire.HeaderSize+n:]
	}
}

func TestSnapshotWorkerBad(t *testing.T) {
	golden := readHex(t, "snapshot_worker.hex")
	patch := func(off int, b ...byte) []byte {
		c := bytes.Clone(golden)
		copy(c[off:], b)
		return c
	}
	const body = wire.HeaderSize
	for _, c := range []struct {
		name  string
		b     []byte
		field string
		err   error
	}{
		{"truncated in the ranks", golden[:len(golden)-20], "", wire.ErrTruncated},
		{"wrong type", patch(6, 3), "type", wire.ErrType},
		{"block size 0", patch(body+8, 0, 0, 0, 0), "block_size", wire.ErrInvalid},
		{"unknown flag", patch(body+12, 0, 1), "flags", wire.ErrInvalid},
		{"negative capacity", patch(body+16, 0, 0, 0, 0, 0, 0, 0, 0x80), "capacity", wire.ErrInvalid},
		{"empty model", emptyModel(golden), "model", wire.ErrInvalid},
		{"rank twice", patch(len(golden)-16, 0), "ranks[1].rank", wire.ErrInvalid},
		{"trailing byte", append(bytes.Clone(golden), 0), "body_length", wire.ErrTrailing},
	} {
		var w wire.SnapshotWorker
		err := wire.DecodeSnapshotWorker(c.b, &w)
		var we *wire.Error
		if !errors.Is(err, c.err) || !errors.As(err, &we) || c.field != "" && we.Field != c.field {
			t.Errorf("%s: got %v, want %v in field %q", c.name, err, c.err, c.field)
		}
	}
	bad := goldenSnapshotWorker
	bad.Ranks = []wire.SnapshotRank{{Seqs: []uint64{1}}}
	if err := bad.Validate(); err == nil {
		t.Error("Validate accepted a rank with fewer engine hashes than sequence hashes")
	}
}

// emptyModel is the golden message with its model "m" replaced by "" (and the body one byte
// shorter).
func emptyModel(golden []byte) []byte {
	const model = wire.HeaderSize + 32
	b := append(append(bytes.Clone(golden[:model]), 0, 0), golden[model+3:]...)
	b[8]-- // body length
	return b
}

func FuzzDecodeSnapshotWorker(f *testing.F) {
	prev := readHex(f, "snapshot_worker.hex")
	f.Add(prev)
	f.Add(wire.AppendSnapshotWorker(nil, randSnapshotWorker(rand.New(rand.NewPCG(1, 1)))))
	f.Fuzz(func(t *testing.T, b []byte) {
		var fresh, reused wire.SnapshotWorker
		if err := wire.DecodeSnapshotWorker(prev, &reused); err != nil {
			t.Fatal(err)
		}
		err := wire.DecodeSnapshotWorker(b, &fresh)
		if err2 := wire.DecodeSnapshotWorker(b, &reused); (err == nil) != (err2 == nil) {
			t.Fatalf("fresh: %v, reused: %v", err, err2)
		}
		if err != nil {
			return
		}
		if err := fresh.Validate(); err != nil {
			t.Fatalf("decoded a value that does not validate: %v", err)
		}
		if enc := wire.AppendSnapshotWorker(nil, &fresh); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded\n%x\nfrom\n%x", enc, b)
		}
		if enc := wire.AppendSnapshotWorker(nil, &reused); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded after reuse\n%x\nfrom\n%x", enc, b)
		}
	})
}

// TestSnapshotWorkerRole holds the role to flags bit 5: a worker of both roles (0) writes the
// bytes of a snapshot before roles, so old snapshots restore as both; prefill and decode add a
// u32 after the weight's place; 0 or 3 there is refused.
func TestSnapshotWorkerRole(t *testing.T) {
	golden := readHex(t, "snapshot_worker.hex")
	w := goldenSnapshotWorker
	w.Role = 1
	b := wire.AppendSnapshotWorker(nil, &w)
	if len(b) != len(golden)+4 {
		t.Fatalf("a role adds %d bytes, want 4", len(b)-len(golden))
	}
	var got wire.SnapshotWorker
	if err := wire.DecodeSnapshotWorker(b, &got); err != nil || got.Role != 1 {
		t.Fatalf("decoded role %d, %v", got.Role, err)
	}
	if err := wire.DecodeSnapshotWorker(golden, &got); err != nil || got.Role != 0 {
		t.Fatalf("a snapshot without bit 5 decoded role %d, %v", got.Role, err)
	}
	at := bytes.Index(b, []byte{1, 0, 0, 0, 2, 0, 0, 0}) // the role, then n_ranks (2)
	if at < 0 {
		t.Fatal("role not found")
	}
	for _, v := range []byte{0, 3} {
		c := bytes.Clone(b)
		c[at] = v
		err := wire.DecodeSnapshotWorker(c, &got)
		var we *wire.Error
		if !errors.As(err, &we) || we.Field != "role" || we.Offset != at {
			t.Errorf("role %d: %v", v, err)
		}
	}
	w.Role = 3
	if err := w.Validate(); err == nil {
		t.Error("Validate accepted role 3")
	}
}

// TestSnapshotWorkerAPIKey holds the API key to flags bit 7: a worker without one writes the
// bytes of a snapshot before keys, and old snapshots restore without one; a key adds a str after
// the role's place; bit 7 with an empty key is refused.
func TestSnapshotWorkerAPIKey(t *testing.T) {
	golden := readHex(t, "snapshot_worker.hex")
	w := goldenSnapshotWorker
	w.APIKey = "sk-worker-key"
	b := wire.AppendSnapshotWorker(nil, &w)
	if len(b) != len(golden)+2+len(w.APIKey) {
		t.Fatalf("a key adds %d bytes, want %d", len(b)-len(golden), 2+len(w.APIKey))
	}
	var got wire.SnapshotWorker
	if err := wire.DecodeSnapshotWorker(b, &got); err != nil || got.APIKey != w.APIKey || !sameWorker(&got, &w) {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	if err := wire.DecodeSnapshotWorker(golden, &got); err != nil || got.APIKey != "" {
		t.Fatalf("a snapshot without bit 7 decoded key %q, %v", got.APIKey, err)
	}
	// The key's length 0, and the message shorter by the key's bytes.
	at := bytes.Index(b, []byte(w.APIKey)) - 2
	c := append(bytes.Clone(b[:at]), 0, 0)
	c = append(c, b[at+2+len(w.APIKey):]...)
	binary.LittleEndian.PutUint32(c[8:], binary.LittleEndian.Uint32(b[8:])-uint32(len(w.APIKey)))
	err := wire.DecodeSnapshotWorker(c, &got)
	var we *wire.Error
	if !errors.As(err, &we) || we.Field != "api_key" || we.Offset != at {
		t.Errorf("an empty key under bit 7: %v", err)
	}
	w.APIKey = strings.Repeat("k", wire.MaxString+1)
	if err := w.Validate(); err == nil {
		t.Error("Validate accepted a key over wire.MaxString")
	}
}
