package wire_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
	"github.com/zeebo/xxh3"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// The engine fixtures in testdata/engine were written by hand from the msgpack spec; every byte
// group is annotated in the file.

// readFrames reads a multipart fixture: each line starting with ">" opens a frame, whose bytes
// follow as in readHex.
func readFrames(tb testing.TB, name string) [][]byte {
	tb.Helper()
	text, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		tb.Fatal(err)
	}
	var frames [][]byte
	for i, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, ">") {
			frames = append(frames, []byte{})
			continue
		}
		line, _, _ = strings.Cut(line, "#")
		for _, f := range strings.Fields(line) {
			b, err := hex.DecodeString(f)
			if err != nil || len(frames) == 0 {
				tb.Fatalf("%s:%d: bytes outside a frame or bad hex: %v", name, i+1, err)
			}
			frames[len(frames)-1] = append(frames[len(frames)-1], b...)
		}
	}
	return frames
}

// The forms whose bytes AppendEngineBatch reproduces.
var (
	formArray   = wire.EngineForm{}
	formMap     = wire.EngineForm{MapBatch: true, MapEvents: true}
	formTagged  = wire.EngineForm{MapEvents: true}
	formInt64   = wire.EngineForm{Hashes: wire.HashInt64}
	allForms    = []wire.EngineForm{formArray, formMap, formTagged, formInt64, {Hashes: wire.HashBytes32}, {MapBatch: true, Hashes: wire.HashBytes32}}
	stored      = func(e kvevent.Event) kvevent.Event { e.Kind = kvevent.Stored; return e }
	clearedOnly = []kvevent.Event{{Kind: kvevent.Cleared}}
)

type engineGolden struct {
	file string
	want wire.EngineBatch
	form *wire.EngineForm // nil: decode only
}

var engineGoldens = []engineGolden{
	{"batch_array.hex", wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{stored(kvevent.Event{
		Hashes: []uint64{0x11, 0x22}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 2})}}, &formArray},
	{"batch_map.hex", wire.EngineBatch{TS: 1747000000.5, HasRank: true, Events: []kvevent.Event{stored(kvevent.Event{
		Hashes: []uint64{5}, Parent: 4, HasParent: true, Tokens: []uint32{7, 8}, BlockSize: 2, LoRA: "sql"})}}, &formMap},
	{"events_tagged.hex", wire.EngineBatch{TS: 0.5, HasRank: true, Events: []kvevent.Event{
		stored(kvevent.Event{Hashes: []uint64{1}, Tokens: []uint32{9}, BlockSize: 1}),
		{Kind: kvevent.Removed, Hashes: []uint64{1}},
		{Kind: kvevent.Cleared},
	}}, &formTagged},
	{"hashes_uint64.hex", wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{stored(kvevent.Event{
		Hashes: []uint64{0xfedcba9876543210, 1 << 63}, Parent: math.MaxUint64, HasParent: true,
		Tokens: []uint32{1, 2}, BlockSize: 1})}}, &formArray},
	{"hashes_int64.hex", wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{stored(kvevent.Event{
		Hashes: []uint64{0xfffffffffffffffe, 0x7fffffffffffffff, 0xfedcba9876543210}, Parent: 1 << 63, HasParent: true,
		Tokens: []uint32{5, 6, 7}, BlockSize: 1})}}, &formInt64},
	{"hashes_bytes32.hex", wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{stored(kvevent.Event{
		Hashes: []uint64{0x0102030405060708, 0xdeadbeef}, Parent: 0x1122334455667788, HasParent: true,
		Tokens: []uint32{1, 2}, BlockSize: 1})}}, nil},
	{"batch_dp_rank.hex", wire.EngineBatch{TS: 1.5, Rank: 3, HasRank: true, Events: []kvevent.Event{stored(kvevent.Event{
		Rank: 3, Hashes: []uint64{0x44}, Parent: 0x33, HasParent: true, Tokens: []uint32{10, 11}, BlockSize: 2})}}, &formArray},
	{"batch_no_rank.hex", wire.EngineBatch{TS: 1.5, Events: []kvevent.Event{
		stored(kvevent.Event{Hashes: []uint64{0x11}, Tokens: []uint32{1, 2}, BlockSize: 2}),
		{Kind: kvevent.Removed, Hashes: []uint64{0x11}},
	}}, nil},
	{"block_removed.hex", wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{
		{Kind: kvevent.Removed, Tier: kvevent.Host, Hashes: []uint64{0x11, 0x22}},
		{Kind: kvevent.Removed, Tier: kvevent.Disk, Hashes: []uint64{300}},
	}}, &formArray},
	{"all_blocks_cleared.hex", wire.EngineBatch{TS: 1.5, HasRank: true, Events: clearedOnly}, &formArray},
	{"extra_keys_mm.hex", wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{stored(kvevent.Event{
		Hashes: []uint64{0x11, 0x22, 0x33}, Tokens: []uint32{1, 2, 3, 4, 5, 6}, BlockSize: 2, LoRA: "ad",
		MM: [][]uint64{{0x0123456789abcdef}, {0x0123456789abcdef, 0xaabbccddeeff0011}, nil}})}}, nil},
	{"trtllm_mm.hex", wire.EngineBatch{TS: 1747000003.5, HasRank: true, Events: []kvevent.Event{
		stored(kvevent.Event{Hashes: []uint64{0x11, 0x22, 0x33}, BlockSize: 4,
			Tokens: []uint32{101, 102, 163254319, 163254319, 163254319, 163254319, 103, 789463633, 789463633, 104, 105, 106},
			MM:     [][]uint64{{0x0123456789abcdef}, {0x0123456789abcdef, 0xaabbccddeeff0011}, {0xaabbccddeeff0011}}}),
		{Kind: kvevent.Removed, Hashes: []uint64{0x33}},
	}}, nil},
	{"sglang_stored.hex", wire.EngineBatch{TS: 1747000001.25, Rank: 1, HasRank: true, Events: []kvevent.Event{
		stored(kvevent.Event{Rank: 1, Tier: kvevent.Host, Hashes: []uint64{0x9c3b1f0e2a475501}, Tokens: []uint32{11}, BlockSize: 1}),
		stored(kvevent.Event{Rank: 1, Hashes: []uint64{0xc10d22a970113e42}, Parent: 0x9c3b1f0e2a475501, HasParent: true,
			Tokens: []uint32{12}, BlockSize: 1}),
		{Kind: kvevent.Removed, Rank: 1, Tier: kvevent.Host, Hashes: []uint64{0x9c3b1f0e2a475501}},
	}}, nil},
	{"sglang_eagle.hex", wire.EngineBatch{TS: 1747000002.5, HasRank: true, Events: []kvevent.Event{
		stored(kvevent.Event{Hashes: []uint64{0xc4e0f1d5b8aafe9d}, Tokens: []uint32{128000, 791}, BlockSize: 2}),
		stored(kvevent.Event{Hashes: []uint64{0x317a2c09e45b6610}, Parent: 0xc4e0f1d5b8aafe9d, HasParent: true,
			Tokens: []uint32{4062, 14198}, BlockSize: 2}),
	}}, nil},
	{"hybrid_groups.hex", wire.EngineBatch{TS: 1.5, HasRank: true, Filtered: 2, Events: []kvevent.Event{
		stored(kvevent.Event{Hashes: []uint64{0x11}, Tokens: []uint32{1, 2}, BlockSize: 2}),
		{Kind: kvevent.Removed, Hashes: []uint64{0x22}},
	}}, nil},
	{"hybrid_removals.hex", wire.EngineBatch{TS: 1.5, HasRank: true, Filtered: 3, Events: []kvevent.Event{
		stored(kvevent.Event{Hashes: []uint64{0x0a}, Tokens: []uint32{1, 2}, BlockSize: 2}),
		stored(kvevent.Event{Hashes: []uint64{0x0d}, Parent: 0x0a, HasParent: true, Tokens: []uint32{3, 4}, BlockSize: 2}),
		{Kind: kvevent.Removed, Hashes: []uint64{0x0e}},
		{Kind: kvevent.Removed, Hashes: []uint64{0x0f}},
	}}, nil},
	{"hybrid_removals_map.hex", wire.EngineBatch{TS: 1.5, HasRank: true, Filtered: 2, Events: []kvevent.Event{
		stored(kvevent.Event{Hashes: []uint64{0x0a}, Tokens: []uint32{1, 2}, BlockSize: 2}),
		{Kind: kvevent.Removed, Hashes: []uint64{0x0e}},
		{Kind: kvevent.Removed, Hashes: []uint64{0x0f}},
	}}, nil},
}

// sameEngine reports whether two decoded batches are equal (TS by its bits, no events however
// held).
func sameEngine(a, b *wire.EngineBatch) bool {
	return math.Float64bits(a.TS) == math.Float64bits(b.TS) && a.Rank == b.Rank && a.HasRank == b.HasRank &&
		a.Skipped == b.Skipped && a.Filtered == b.Filtered &&
		a.UnknownMedium == b.UnknownMedium && a.UnknownMediumName == b.UnknownMediumName && len(a.Events) == len(b.Events) &&
		(len(a.Events) == 0 || reflect.DeepEqual(a.Events, b.Events))
}

func TestEngineGolden(t *testing.T) {
	var reused wire.EngineBatch
	for _, g := range engineGoldens {
		t.Run(g.file, func(t *testing.T) {
			payload := readHex(t, "engine/"+g.file)
			var got wire.EngineBatch
			if err := got.Decode(payload); err != nil {
				t.Fatal(err)
			}
			if !sameEngine(&got, &g.want) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", got, g.want)
			}
			// Into a batch that held every fixture before: the same.
			if err := reused.Decode(payload); err != nil || !sameEngine(&reused, &g.want) {
				t.Fatalf("decoded into a reused batch (%v)\n%+v\nwant\n%+v", err, reused, g.want)
			}
			if g.form != nil {
				if enc := wire.AppendEngineBatch(nil, &got, *g.form); !bytes.Equal(enc, payload) {
					t.Fatalf("AppendEngineBatch(%+v)\n%x\nwant the fixture\n%x", *g.form, enc, payload)
				}
			}
			// Every form carries what was decoded.
			want := got
			want.Skipped, want.Filtered, want.UnknownMedium, want.UnknownMediumName = 0, 0, 0, ""
			for _, f := range allForms {
				var again wire.EngineBatch
				if err := again.Decode(wire.AppendEngineBatch(nil, &got, f)); err != nil || !sameEngine(&again, &want) {
					t.Fatalf("form %+v: re-decoded (%v)\n%+v\nwant\n%+v", f, err, again, want)
				}
			}
		})
	}
}

// TestEngineHashBytes32 pins the bytes of the bin form: 24 zero bytes, then the id.
func TestEngineHashBytes32(t *testing.T) {
	b := wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Removed, Hashes: []uint64{0x0102030405060708}}}}
	got := wire.AppendEngineBatch(nil, &b, wire.EngineForm{Hashes: wire.HashBytes32})
	want, _ := hex.DecodeString("93cb3ff8000000000000" + "91" + "93" + "ac426c6f636b52656d6f766564" +
		"91c420" + strings.Repeat("00", 24) + "0102030405060708" + "a3475055" + "00")
	if !bytes.Equal(got, want) {
		t.Fatalf("got\n%x\nwant\n%x", got, want)
	}
}

func TestEngineReplayFrames(t *testing.T) {
	payload := readHex(t, "engine/all_blocks_cleared.hex")
	for _, name := range []string{"replay_topic.hex", "replay_no_topic.hex"} {
		seq, p, end, err := wire.ParseReplayReply(readFrames(t, "engine/"+name))
		if err != nil || seq != 5 || end || !bytes.Equal(p, payload) {
			t.Fatalf("%s: seq %d, end %v, payload %x, err %v; want 5, false, %x", name, seq, end, p, err, payload)
		}
		var b wire.EngineBatch
		if err := b.Decode(p); err != nil || !reflect.DeepEqual(b.Events, clearedOnly) {
			t.Fatalf("%s: payload decodes to %+v, %v", name, b.Events, err)
		}
	}
	endFrames := readFrames(t, "engine/replay_end.hex")
	if seq, p, end, err := wire.ParseReplayReply(endFrames); err != nil || !end || seq != wire.EngineSeqEnd || p != nil {
		t.Fatalf("end marker: seq %#x, end %v, payload %x, err %v", seq, end, p, err)
	}
	// A DEALER keeps the empty delimiter frame; newer releases add the topic after it.
	withDelim := append([][]byte{{}, []byte("kv@w1")}, endFrames...)
	if _, _, end, err := wire.ParseReplayReply(withDelim); err != nil || !end {
		t.Fatalf("[\"\", topic, seq, payload] end marker: end %v, err %v", end, err)
	}

	if seq, err := wire.ParseEngineSeq(endFrames[0]); err != nil || seq != wire.EngineSeqEnd {
		t.Fatalf("ParseEngineSeq(ff × 8) = %#x, %v", seq, err)
	}
	if seq, err := wire.ParseEngineSeq([]byte{0, 0, 0, 0, 0, 0, 1, 2}); err != nil || seq != 258 {
		t.Fatalf("ParseEngineSeq(258) = %d, %v", seq, err)
	}

	seq8 := []byte{0, 0, 0, 0, 0, 0, 0, 9}
	f := func(frames [][]byte, field string) {
		t.Helper()
		_, _, _, err := wire.ParseReplayReply(frames)
		checkError(t, err, "engine frames", wire.ErrInvalid, field, -1)
	}
	f(nil, "frames")
	f([][]byte{seq8}, "frames")
	f([][]byte{[]byte("x"), []byte("topic"), seq8, payload}, "frames") // 4 frames need an empty first
	f([][]byte{seq8, seq8, seq8, seq8, payload}, "frames")
	f([][]byte{seq8[1:], payload}, "frames[0].seq")
	f([][]byte{[]byte("t"), seq8[:7], payload}, "frames[1].seq")
	f([][]byte{endFrames[0], payload}, "frames[1].payload") // an end marker carries nothing
	_, err := wire.ParseEngineSeq(seq8[:3])
	checkError(t, err, "engine frames", wire.ErrInvalid, "seq", 0)
}

// mp builds msgpack test input with msgp's appenders.
type mp []byte

func (m mp) arr(n int) mp     { return msgp.AppendArrayHeader(m, uint32(n)) }
func (m mp) mapn(n int) mp    { return msgp.AppendMapHeader(m, uint32(n)) }
func (m mp) str(s string) mp  { return msgp.AppendString(m, s) }
func (m mp) u(v uint64) mp    { return msgp.AppendUint64(m, v) }
func (m mp) i(v int64) mp     { return msgp.AppendInt64(m, v) }
func (m mp) f(v float64) mp   { return msgp.AppendFloat64(m, v) }
func (m mp) nil() mp          { return msgp.AppendNil(m) }
func (m mp) bin(b []byte) mp  { return msgp.AppendBytes(m, b) }
func (m mp) raw(b ...byte) mp { return append(m, b...) }
func (m mp) hx(s string) mp {
	b, _ := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	return append(m, b...)
}
func (m mp) stored(n int) mp { return m.arr(n).str("BlockStored") }
func hashes(m mp, h ...uint64) mp {
	m = m.arr(len(h))
	for _, x := range h {
		m = m.u(x)
	}
	return m
}

// batch wraps events (already encoded, n of them) as [1.5, events, 0].
func batch(n int, events mp) []byte { return append(mp(nil).arr(3).f(1.5).arr(n), events...).u(0) }

func decodeEngine(t *testing.T, payload []byte) *wire.EngineBatch {
	t.Helper()
	var b wire.EngineBatch
	if err := b.Decode(payload); err != nil {
		t.Fatalf("decode %x: %v", payload, err)
	}
	return &b
}

func TestEngineForms(t *testing.T) {
	st := kvevent.Event{Kind: kvevent.Stored, Hashes: []uint64{1}, Tokens: []uint32{1, 2}, BlockSize: 2}
	f := func(name string, payload []byte, want wire.EngineBatch) {
		t.Helper()
		if got := decodeEngine(t, payload); !sameEngine(got, &want) {
			t.Fatalf("%s: decoded\n%+v\nwant\n%+v", name, *got, want)
		}
	}
	storedArr := mp(nil).stored(5).raw(0x91, 1, 0xc0, 0x92, 1, 2, 2)

	f("rank nil", append(mp(nil).arr(3).f(1.5).arr(1), storedArr...).nil(),
		wire.EngineBatch{TS: 1.5, Events: []kvevent.Event{st}})
	f("ts int, extra batch elements", append(mp(nil).arr(5).u(7).arr(1), storedArr...).u(2).str("later").nil(),
		wire.EngineBatch{TS: 7, Rank: 2, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, Rank: 2, Hashes: []uint64{1}, Tokens: []uint32{1, 2}, BlockSize: 2}}})
	f("ts negative int", append(mp(nil).arr(2).i(-3).arr(1), storedArr...),
		wire.EngineBatch{TS: -3, Events: []kvevent.Event{st}})
	f("ts float32", append(mp(nil).arr(2).raw(0xca, 0x3f, 0xc0, 0, 0).arr(1), storedArr...),
		wire.EngineBatch{TS: 1.5, Events: []kvevent.Event{st}})
	f("map batch: any key order, unknown keys, SGLang's rank key",
		append(mp(nil).mapn(4).str("attn_dp_rank").u(4).str("extra").arr(1).nil().str("events").arr(1), storedArr...).str("ts").f(2),
		wire.EngineBatch{TS: 2, Rank: 4, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, Rank: 4, Hashes: []uint64{1}, Tokens: []uint32{1, 2}, BlockSize: 2}}})
	f("map batch: Dynamo's dp_rank, bin keys", append(mp(nil).mapn(3).bin([]byte("ts")).f(1).bin([]byte("events")).arr(1), storedArr...).str("dp_rank").nil(),
		wire.EngineBatch{TS: 1, Events: []kvevent.Event{st}})

	// Unknown event types, array and map, are counted and skipped, whatever they hold.
	f("unknown types", batch(4, append(mp(nil).arr(3).str("BlockTransferred").hx("93 01 02 03").mapn(1).str("x").nil().
		mapn(2).str("type").str("KVSnapshot").str("blocks").arr(2).u(1).u(2).
		arr(1).str("AllBlocksCleared"), storedArr...)),
		wire.EngineBatch{TS: 1.5, HasRank: true, Skipped: 2, Events: []kvevent.Event{{Kind: kvevent.Cleared}, st}})
	f("extra positions ignored", batch(2, mp(nil).arr(3).str("AllBlocksCleared").nil().u(5).
		arr(7).str("BlockRemoved").arr(1).u(9).nil().nil().nil().nil().str("future")),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Cleared}, {Kind: kvevent.Removed, Hashes: []uint64{9}}}})
	f("tagged map, type not first, unknown keys", batch(1, mp(nil).mapn(6).str("block_size").u(2).str("new_field").arr(2).u(1).nil().
		str("token_ids").arr(2).u(1).u(2).str("type").str("BlockStored").str("block_hashes").arr(1).u(1).str("medium").nil()),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{st}})
	f("tagged map removal ignores stored-only keys", batch(1, mp(nil).mapn(4).str("type").str("BlockRemoved").str("block_hashes").arr(1).u(3).
		str("token_ids").str("not read").str("medium").str("disk")),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Removed, Tier: kvevent.Disk, Hashes: []uint64{3}}}})
	f("empty lists are nil", batch(1, mp(nil).stored(6).arr(0).nil().arr(0).u(16).nil()),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, BlockSize: 16}}})
	f("token encodings", batch(1, mp(nil).stored(5).arr(1).u(1).nil().arr(6).u(0).u(200).u(60000).u(1<<32-1).i(5).raw(0xcf, 0, 0, 0, 0, 0, 0, 0, 9).u(3)),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, Hashes: []uint64{1}, Tokens: []uint32{0, 200, 60000, 1<<32 - 1, 5, 9}, BlockSize: 3}}})

	// extra_keys: bare identifiers (older vLLM) count; entries without multimodal items leave MM nil.
	id := func(h string) string { return h + strings.Repeat("0", 64-len(h)) }
	f("bare identifiers", batch(1, mp(nil).stored(9).arr(2).u(1).u(2).nil().arr(0).u(0).nil().str("GPU").nil().
		arr(2).arr(2).str(id("00000000000000ff")).str("not-hex-"+id("")[8:]).nil()),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, Hashes: []uint64{1, 2}, MM: [][]uint64{{0xff}, nil}}}})
	f("no multimodal items: MM nil", batch(1, mp(nil).stored(9).arr(2).u(1).u(2).nil().arr(0).u(0).nil().str("GPU").str("lora").
		arr(2).arr(1).str("lora").arr(2).str("lora").str("salt")),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, Hashes: []uint64{1, 2}, LoRA: "lora"}}})
	// An identifier tagged with its offset is a multimodal object's whatever its form: a
	// canonical digest gives its first 16 hex digits, any other XXH3-64 of its bytes (Dynamo's
	// lib/kv-router/src/zmq_wire/extra_keys.rs@035d726, hash_mm_identifier).
	f("opaque identifier with an offset", batch(1, mp(nil).stored(9).arr(1).u(1).nil().arr(0).u(0).nil().str("GPU").nil().
		arr(1).arr(1).arr(2).str("opaque-renderer-image-0").i(-3)),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, Hashes: []uint64{1}, MM: [][]uint64{{xxh3.HashString("opaque-renderer-image-0")}}}}})
	// The cache salt: Dynamo tags it "dynamo-cache-salt:" among the first block's extra keys
	// (an untagged string is not one; an item that is the LoRA name is passed over once); a
	// map's own cache_salt wins (Dynamo's zmq_wire deserialize.rs@0917ca2).
	f("tagged salt in extra_keys", batch(1, mp(nil).stored(9).arr(2).u(1).u(2).nil().arr(0).u(0).nil().str("GPU").nil().
		arr(2).arr(3).str("tenant-x").str("dynamo-cache-salt:").str("dynamo-cache-salt:tenant-a").arr(1).str("dynamo-cache-salt:tenant-b")),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, Hashes: []uint64{1, 2}, Salt: "tenant-a"}}})
	f("salt equal to the LoRA name", batch(1, mp(nil).stored(9).arr(1).u(1).nil().arr(0).u(0).nil().str("GPU").str("dynamo-cache-salt:a").
		arr(1).arr(2).str("dynamo-cache-salt:a").str("dynamo-cache-salt:b")),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, Hashes: []uint64{1}, LoRA: "dynamo-cache-salt:a", Salt: "b"}}})
	f("cache_salt in a map wins", batch(1, mp(nil).mapn(6).str("type").str("BlockStored").str("block_hashes").arr(1).u(1).
		str("extra_keys").arr(1).arr(1).str("dynamo-cache-salt:tagged").str("token_ids").arr(0).str("block_size").u(0).str("cache_salt").str("named")),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, Hashes: []uint64{1}, Salt: "named"}}})
	f("cache_salt nil in a map", batch(1, mp(nil).mapn(6).str("type").str("BlockStored").str("block_hashes").arr(1).u(1).
		str("cache_salt").nil().str("token_ids").arr(0).str("block_size").u(0).str("extra_keys").arr(1).arr(1).str("dynamo-cache-salt:tagged")),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, Hashes: []uint64{1}, Salt: "tagged"}}})
	f("odd items skipped", batch(1, mp(nil).stored(9).arr(1).u(1).nil().arr(0).u(0).nil().str("GPU").nil().
		arr(1).arr(5).arr(0).arr(2).u(1).str(id("1")).mapn(1).u(1).u(2).f(2.5).raw(0xc3)),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, Hashes: []uint64{1}}}})
	f("extra_keys nil or empty", batch(2, mp(nil).stored(9).arr(1).u(1).nil().arr(0).u(0).nil().nil().nil().nil().
		stored(9).arr(1).u(1).nil().arr(0).u(0).nil().nil().nil().arr(0)),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Stored, Hashes: []uint64{1}}, {Kind: kvevent.Stored, Hashes: []uint64{1}}}})

	// KV-cache groups: the spec kind decides, else the group index.
	grp := func(group, kind mp) mp {
		return append(append(mp(nil).stored(11).arr(1).u(1).nil().arr(0).u(0).nil().nil().nil().nil(), group...), kind...)
	}
	f("groups", batch(6, append(append(append(append(append(
		grp(mp(nil).u(0), mp(nil).nil()),
		grp(mp(nil).u(2), mp(nil).str("mla_attention"))...),
		grp(mp(nil).nil(), mp(nil).str("sink_full_attention"))...),
		grp(mp(nil).u(1), mp(nil).nil())...),
		grp(mp(nil).u(0), mp(nil).str("mamba"))...),
		grp(mp(nil).u(7), mp(nil).str("some_new_kind"))...)),
		wire.EngineBatch{TS: 1.5, HasRank: true, Filtered: 3, Events: []kvevent.Event{
			{Kind: kvevent.Stored, Hashes: []uint64{1}}, {Kind: kvevent.Stored, Hashes: []uint64{1}}, {Kind: kvevent.Stored, Hashes: []uint64{1}}}})
	f("removal group in a map", batch(1, mp(nil).mapn(4).str("type").str("BlockRemoved").str("block_hashes").arr(1).u(1).
		str("group_idx").u(1).str("kv_cache_spec_kind").str("full_attention")),
		wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Removed, Hashes: []uint64{1}}}})

	// Media in any case and spelling kvevent.ParseMedium knows.
	for medium, tier := range map[string]kvevent.Tier{"GPU": kvevent.Device, "gpu": kvevent.Device, "": kvevent.Device,
		"CPU": kvevent.Host, "CPU_PINNED": kvevent.Host, "CPU_TIER1": kvevent.Host, "CPU_TIER2": kvevent.Disk, "DISK": kvevent.Disk,
		"NVME": kvevent.Disk, "STORAGE": kvevent.Disk, "EXTERNAL": kvevent.External, "REMOTE": kvevent.External, "shared": kvevent.External} {
		f("medium "+medium, batch(1, mp(nil).arr(3).str("BlockRemoved").arr(0).str(medium)),
			wire.EngineBatch{TS: 1.5, HasRank: true, Events: []kvevent.Event{{Kind: kvevent.Removed, Tier: tier}}})
	}
	// A medium it does not know is the device tier, as Dynamo reads it, counted with the first
	// such name; the batch's other events stand. A filtered event is not counted.
	f("unknown media", batch(4, mp(nil).arr(3).str("BlockRemoved").arr(1).u(1).str("TPU").
		stored(7).arr(1).u(2).nil().arr(1).u(5).u(1).nil().str("HBM3").
		arr(3).str("BlockRemoved").arr(1).u(3).str("CPU").
		arr(4).str("BlockRemoved").arr(1).u(4).str("NPU").u(1)),
		wire.EngineBatch{TS: 1.5, HasRank: true, Filtered: 1, UnknownMedium: 2, UnknownMediumName: "TPU", Events: []kvevent.Event{
			{Kind: kvevent.Removed, Hashes: []uint64{1}},
			{Kind: kvevent.Stored, Hashes: []uint64{2}, Tokens: []uint32{5}, BlockSize: 1},
			{Kind: kvevent.Removed, Tier: kvevent.Host, Hashes: []uint64{3}}}})
	var b wire.EngineBatch // the count and the name are the last payload's
	for _, c := range []struct {
		medium string
		n      int
		name   string
	}{{"TPU", 1, "TPU"}, {"GPU", 0, ""}} {
		if err := b.Decode(batch(1, mp(nil).arr(3).str("BlockRemoved").arr(0).str(c.medium))); err != nil ||
			b.UnknownMedium != c.n || b.UnknownMediumName != c.name {
			t.Fatalf("medium %s: %v, unknown media %d %q; want %d %q", c.medium, err, b.UnknownMedium, b.UnknownMediumName, c.n, c.name)
		}
	}
}

// TestEngineLoRAAliasesPayload documents that LoRA names share the payload's memory.
func TestEngineLoRAAliasesPayload(t *testing.T) {
	payload := readHex(t, "engine/batch_map.hex")
	b := decodeEngine(t, payload)
	i := bytes.Index(payload, []byte("sql"))
	payload[i] = 'x'
	if b.Events[0].LoRA != "xql" {
		t.Fatalf("LoRA %q after changing the payload, want it to alias the payload", b.Events[0].LoRA)
	}
}

func TestEngineErrors(t *testing.T) {
	f := func(name string, payload []byte, want error, field string, offset int) {
		t.Helper()
		var b wire.EngineBatch
		err := b.Decode(payload)
		if want == nil && err == nil {
			return
		}
		if err == nil {
			t.Fatalf("%s: decoded %x without error", name, payload)
		}
		checkError(t, err, "engine batch", want, field, offset)
	}
	// batch_array.hex, byte by byte: 0 batch, 1 ts, 10 events, 11 events[0], 12 tag, 24 hashes
	// (25, 26), 27 parent, 28 tokens (29-32), 33 block_size, 34 lora_id, 35 medium, 39 lora_name,
	// 40 rank; 41 bytes.
	golden := readHex(t, "engine/batch_array.hex")
	set := func(off int, b ...byte) []byte {
		p := bytes.Clone(golden)
		return append(p[:off:off], append(b, p[off+1:]...)...)
	}
	f("hash a bool", set(26, 0xc3), wire.ErrInvalid, "events[0].block_hashes[1]", 26)
	f("hash a float", set(25, 0xca, 0, 0, 0, 0), wire.ErrInvalid, "events[0].block_hashes[0]", 25)
	f("hash a str", set(26, 0xa1, 'x'), wire.ErrInvalid, "events[0].block_hashes[1]", 26)
	f("hashes a map", set(24, 0x80), wire.ErrInvalid, "events[0].block_hashes", 24)
	f("parent a str", set(27, 0xa0), wire.ErrInvalid, "events[0].parent_block_hash", 27)
	f("negative token", set(31, 0xff), wire.ErrInvalid, "events[0].token_ids[2]", 31)
	f("negative token int8", set(31, 0xd0, 0x80), wire.ErrInvalid, "events[0].token_ids[2]", 31)
	f("token over 2^32-1", set(30, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0), wire.ErrInvalid, "events[0].token_ids[1]", 30)
	f("token a float", set(29, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0), wire.ErrInvalid, "events[0].token_ids[0]", 29)
	f("a token among pairs (EAGLE)", set(29, 0x92, 1, 2), wire.ErrInvalid, "events[0].token_ids[1]", 32)
	f("a pair among tokens", set(30, 0x92, 2, 3), wire.ErrInvalid, "events[0].token_ids[1]", 30)
	f("tokens nil", set(28, 0xc0, 0xc0), wire.ErrInvalid, "events[0].token_ids", 28)
	f("negative block size", set(33, 0xff), wire.ErrInvalid, "events[0].block_size", 33)
	f("block size over 2^32-1", set(33, 0xcf, 1, 0, 0, 0, 0, 0, 0, 0), wire.ErrInvalid, "events[0].block_size", 33)
	f("medium an int", set(35, 0x01, 0xc0, 0xc0, 0xc0), wire.ErrInvalid, "events[0].medium", 35)
	f("lora_name an int", set(39, 0x05), wire.ErrInvalid, "events[0].lora_name", 39)
	f("negative rank", set(40, 0xff), wire.ErrInvalid, "data_parallel_rank", 40)
	f("rank over 2^32-1", set(40, 0xcf, 1, 0, 0, 0, 0, 0, 0, 0), wire.ErrInvalid, "data_parallel_rank", 40)
	f("rank a str", set(40, 0xa1, '0'), wire.ErrInvalid, "data_parallel_rank", 40)
	f("type an int", set(12, 0x01), wire.ErrInvalid, "events[0].type", 12)
	f("event a str", set(11, 0xa0), wire.ErrInvalid, "events[0]", 11)
	f("events a map", set(10, 0x80), wire.ErrInvalid, "events", 10)
	f("ts a str", set(1, 0xa0), wire.ErrInvalid, "ts", 1)
	f("ts nil", set(1, 0xc0), wire.ErrInvalid, "ts", 1)
	f("batch an int", []byte{0x05}, wire.ErrInvalid, "batch", 0)
	f("batch of one element", []byte{0x91, 0x00}, wire.ErrInvalid, "batch", 0)
	f("empty payload", nil, wire.ErrTruncated, "batch", 0)
	f("trailing bytes", append(bytes.Clone(golden), 0), wire.ErrTrailing, "payload", 41)
	f("no msgpack type", set(34, 0xc1), wire.ErrInvalid, "events[0].lora_id", 34)
	cut := func(p []byte, from, to int) []byte { return append(p[:from:from], p[to:]...) }
	f("stored without block_size", cut(set(11, 0x94), 33, 40), wire.ErrInvalid, "events[0].block_size", 11)
	f("stored without tokens", cut(set(11, 0x93), 28, 40), wire.ErrInvalid, "events[0].token_ids", 11)
	f("empty event array", []byte{0x92, 0x00, 0x91, 0x90}, wire.ErrInvalid, "events[0].type", 3)
	f("count larger than the payload", set(28, 0xdc, 0xff, 0xff), wire.ErrTruncated, "events[0].token_ids", 28)
	f("events count larger than the payload", set(10, 0xdd, 0xff, 0xff, 0xff, 0xff), wire.ErrTruncated, "events", 10)
	f("ts cut", golden[:5], wire.ErrTruncated, "ts", 1)

	// EAGLE pairs (sglang_eagle.hex): 35 token_ids, 36 pair 0 (37 first, 42 second), 45 pair 1
	// (46, 49).
	eagle := readHex(t, "engine/sglang_eagle.hex")
	setE := func(off int, b ...byte) []byte {
		p := bytes.Clone(eagle)
		return append(p[:off:off], append(b, p[off+1:]...)...)
	}
	f("pairs that do not overlap", setE(48, 0x18), wire.ErrInvalid, "events[0].token_ids[1][0]", 46)
	f("a pair of three", setE(36, 0x93, 0x07), wire.ErrInvalid, "events[0].token_ids[0]", 36)
	f("a pair of one", setE(45, 0x91), wire.ErrInvalid, "events[0].token_ids[1]", 45)
	f("a pair in an array16", setE(36, 0xdc, 0x00, 0x02), nil, "", 0)
	f("a pair a map", setE(45, 0x82), wire.ErrInvalid, "events[0].token_ids[1]", 45)
	f("a pair's token negative", setE(42, 0xff), wire.ErrInvalid, "events[0].token_ids[0][1]", 42)
	f("a pair's token a str", setE(37, 0xa0), wire.ErrInvalid, "events[0].token_ids[0][0]", 37)
	f("a pair's token over 2^32-1", setE(42, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0), wire.ErrInvalid, "events[0].token_ids[0][1]", 42)
	f("pairs cut", eagle[:40], wire.ErrTruncated, "events[0].token_ids[0][0]", 37)

	rm := func(n int) mp { return mp(nil).arr(n).str("BlockRemoved") }
	f("removal without hashes", batch(1, rm(1)), wire.ErrInvalid, "events[0].block_hashes", 11)
	f("later event", batch(2, append(rm(2).arr(0), rm(3).arr(1).u(1).u(7)...)), wire.ErrInvalid, "events[1].medium", -2)
	f("map event without type", batch(1, mp(nil).mapn(1).str("block_hashes").arr(0)), wire.ErrInvalid, "events[0].type", 11)
	f("map event type an int", batch(1, mp(nil).mapn(1).str("type").u(1)), wire.ErrInvalid, "events[0].type", -2)
	f("map event key an int", batch(1, mp(nil).mapn(1).u(1).u(1)), wire.ErrInvalid, "events[0]", 12)
	f("duplicate type", batch(1, mp(nil).mapn(3).str("type").str("BlockRemoved").str("block_hashes").arr(0).str("type").str("BlockRemoved")),
		wire.ErrInvalid, "events[0].type", -2)
	f("duplicate field", batch(1, mp(nil).mapn(3).str("type").str("BlockRemoved").str("medium").nil().str("medium").nil()),
		wire.ErrInvalid, "events[0].medium", -2)
	f("duplicate batch key", mp(nil).mapn(3).str("ts").f(1).str("events").arr(0).str("ts").f(1), wire.ErrInvalid, "ts", -2)
	f("map batch without events", mp(nil).mapn(1).str("ts").f(1), wire.ErrInvalid, "events", 0)
	f("map batch without ts", mp(nil).mapn(1).str("events").arr(0), wire.ErrInvalid, "ts", 0)
	f("map batch key an int", mp(nil).mapn(1).u(1).u(1), wire.ErrInvalid, "batch", 1)
	// Group fields: by type past the fixed positions, as Dynamo reads them (u32 or str), by
	// name in a map.
	f("removal group a float", batch(1, rm(4).arr(0).nil().f(1)), wire.ErrInvalid, "events[0][3]", -2)
	f("removal group negative", batch(1, rm(4).arr(0).nil().i(-1)), wire.ErrInvalid, "events[0][3]", -2)
	f("removal window over 2^32-1", batch(1, rm(6).arr(0).nil().u(1).str("sliding_window").u(1<<32)), wire.ErrInvalid, "events[0][5]", -2)
	f("removal tail an array", batch(1, rm(4).arr(0).nil().arr(0)), wire.ErrInvalid, "events[0][3]", -2)
	f("stored tail a map", batch(1, mp(nil).stored(10).arr(0).nil().arr(0).u(0).nil().nil().nil().nil().mapn(0)), wire.ErrInvalid, "events[0][9]", -2)
	rmMap := func(k string, v mp) []byte {
		return batch(1, append(mp(nil).mapn(3).str("type").str("BlockRemoved").str("block_hashes").arr(0).str(k), v...))
	}
	f("group_idx a str", rmMap("group_idx", mp(nil).str("0")), wire.ErrInvalid, "events[0].group_idx", -2)
	f("group_idx negative", rmMap("group_idx", mp(nil).i(-2)), wire.ErrInvalid, "events[0].group_idx", -2)
	f("spec kind an int", rmMap("kv_cache_spec_kind", mp(nil).u(1)), wire.ErrInvalid, "events[0].kv_cache_spec_kind", -2)
	f("sliding window a str", rmMap("kv_cache_spec_sliding_window", mp(nil).str("4096")), wire.ErrInvalid, "events[0].kv_cache_spec_sliding_window", -2)

	ek := func(keys mp) []byte {
		return batch(1, append(mp(nil).stored(9).arr(2).u(1).u(2).nil().arr(0).u(0).nil().nil().nil(), keys...))
	}
	f("extra_keys a str", ek(mp(nil).str("x")), wire.ErrInvalid, "events[0].extra_keys", -2)
	f("extra_keys shorter than the blocks", ek(mp(nil).arr(1).nil()), wire.ErrInvalid, "events[0].extra_keys", -2)
	f("extra_keys longer than the blocks", ek(mp(nil).arr(3).nil().nil().nil()), wire.ErrInvalid, "events[0].extra_keys", -2)
	f("extra_keys entry an int", ek(mp(nil).arr(2).nil().u(3)), wire.ErrInvalid, "events[0].extra_keys[1]", -2)
	f("extra key cut", ek(mp(nil).arr(2).nil().arr(1).raw(0xd9, 64, '0'))[:0], wire.ErrTruncated, "batch", 0)
	f("extra key invalid", ek(mp(nil).arr(2).nil().arr(2).nil().raw(0xc1)), wire.ErrInvalid, "events[0].extra_keys[1][1]", -2)

	// Depth: a skipped value nested past 64 levels is an error, however deep it goes.
	deep := bytes.Repeat([]byte{0x91}, 200000)
	f("deep nesting", batch(1, append(mp(nil).arr(2).str("Unknown"), deep...)), wire.ErrInvalid, "events[0][1]", -2)
	f("deep map", batch(1, append(mp(nil).arr(2).str("Unknown"), bytes.Repeat([]byte{0x81, 0x00}, 100)...)), wire.ErrInvalid, "events[0][1]", -2)
	f("64 levels are fine", batch(1, append(append(mp(nil).arr(2).str("Unknown"), bytes.Repeat([]byte{0x91}, 64)...), 0)), nil, "", 0)

	// The message reads as documented.
	err := (&wire.EngineBatch{}).Decode(set(31, 0xff))
	if want := `wire: engine batch: field "events[0].token_ids[2]" at offset 31: invalid value: -1, want a token id from 0 to 2^32-1`; err.Error() != want {
		t.Fatalf("error\n%s\nwant\n%s", err, want)
	}
}

// TestEngineTruncatedEverywhere cuts every fixture at every byte: always a truncation error.
func TestEngineTruncatedEverywhere(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	payloads := [][]byte{wire.AppendEngineBatch(nil, randEngineBatch(r, 5, 3, 4, true), formMap)}
	for _, g := range engineGoldens {
		payloads = append(payloads, readHex(t, "engine/"+g.file))
	}
	var b wire.EngineBatch
	for _, p := range payloads {
		for n := range len(p) {
			err := b.Decode(p[:n])
			if !errors.Is(err, wire.ErrTruncated) {
				t.Fatalf("%x cut to %d bytes: %v, want a truncation", p, n, err)
			}
			checkError(t, err, "engine batch", wire.ErrTruncated, "", -2)
		}
	}
}

// TestEngineMutations changes every byte of every fixture to bytes that start each msgpack
// type: decoding returns nil or an *Error, never panics.
func TestEngineMutations(t *testing.T) {
	subst := []byte{0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xc4, 0xc7, 0xca, 0xcb, 0xcc,
		0xcf, 0xd0, 0xd3, 0xd4, 0xd9, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff}
	var b wire.EngineBatch
	for _, g := range engineGoldens {
		p := readHex(t, "engine/"+g.file)
		for i := range p {
			for _, c := range subst {
				q := bytes.Clone(p)
				q[i] = c
				if err := b.Decode(q); err != nil {
					var e *wire.Error
					if !errors.As(err, &e) {
						t.Fatalf("%s: byte %d = %#02x: %v (%T), want a *wire.Error", g.file, i, c, err, err)
					}
				}
			}
		}
	}
}

// randEngineBatch makes a batch of stored, removed and cleared events; stored events have
// blocks × blockSize tokens and, if mm, multimodal hashes on some blocks.
func randEngineBatch(r *rand.Rand, events, blocks, blockSize int, mm bool) *wire.EngineBatch {
	b := &wire.EngineBatch{TS: 1.7e9 + r.Float64(), Rank: uint32(r.IntN(4)), HasRank: r.IntN(4) != 0}
	if !b.HasRank {
		b.Rank = 0
	}
	for i := range events {
		e := kvevent.Event{Rank: b.Rank, Tier: kvevent.Tier(r.IntN(4))}
		switch k := r.IntN(16); {
		case k == 0 && i > 0:
			b.Events = append(b.Events, kvevent.Event{Kind: kvevent.Cleared, Rank: b.Rank})
			continue
		case k < 4:
			e.Kind = kvevent.Removed
			for range 1 + r.IntN(blocks) {
				e.Hashes = append(e.Hashes, r.Uint64())
			}
		default:
			e.Kind, e.BlockSize = kvevent.Stored, blockSize
			if e.HasParent = r.IntN(2) == 0; e.HasParent {
				e.Parent = r.Uint64()
			}
			for range blocks {
				e.Hashes = append(e.Hashes, r.Uint64())
			}
			for range blocks * blockSize {
				e.Tokens = append(e.Tokens, r.Uint32N(200000))
			}
			if r.IntN(3) == 0 {
				e.LoRA = "adapter-" + string(rune('a'+r.IntN(26)))
			}
			if mm && r.IntN(2) == 0 {
				e.MM = make([][]uint64, blocks)
				e.MM[r.IntN(blocks)] = []uint64{r.Uint64(), r.Uint64()}
			}
			if blocks > 0 && r.IntN(3) == 0 {
				e.Salt = "tenant-" + string(rune('a'+r.IntN(26)))
			}
		}
		b.Events = append(b.Events, e)
	}
	return b
}

func TestEngineRoundTripRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	var got wire.EngineBatch
	for range 200 {
		want := randEngineBatch(r, 1+r.IntN(20), 1+r.IntN(8), 1+r.IntN(32), true)
		for _, f := range allForms {
			enc := wire.AppendEngineBatch(nil, want, f)
			if err := got.Decode(enc); err != nil || !sameEngine(&got, want) {
				t.Fatalf("form %+v: decoded (%v)\n%+v\nwant\n%+v", f, err, got, *want)
			}
			if again := wire.AppendEngineBatch(nil, &got, f); !bytes.Equal(again, enc) {
				t.Fatalf("form %+v: re-encoded\n%x\nwant\n%x", f, again, enc)
			}
		}
	}
}

// TestEngineAllocs checks that Decode into a reused batch, and AppendEngineBatch into a reused
// buffer, allocate nothing once they have grown.
func TestEngineAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	var b wire.EngineBatch
	buf := make([]byte, 0, 1<<20)
	f := func(name string, run func()) {
		t.Helper()
		run()
		if n := testing.AllocsPerRun(100, run); n != 0 {
			t.Errorf("%s: %v allocations per run, want 0", name, n)
		}
	}
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	big := randEngineBatch(r, 32, 16, 16, true)
	for _, form := range allForms {
		payload := wire.AppendEngineBatch(nil, big, form)
		f("Decode", func() { must(b.Decode(payload)) })
		f("AppendEngineBatch", func() { buf = wire.AppendEngineBatch(buf[:0], big, form) })
	}
	for _, g := range engineGoldens {
		payload := readHex(t, "engine/"+g.file)
		f("Decode "+g.file, func() { must(b.Decode(payload)) })
	}
	frames := readFrames(t, "engine/replay_topic.hex")
	f("ParseReplayReply", func() { _, _, _, err := wire.ParseReplayReply(frames); must(err) })
}

// TestEngineEncodeInvalid: what the format cannot carry is written so that Decode refuses or
// skips it, never read back as something else.
func TestEngineEncodeInvalid(t *testing.T) {
	f := func(name string, e kvevent.Event, want error, field string) {
		t.Helper()
		for _, form := range allForms {
			var b wire.EngineBatch
			err := b.Decode(wire.AppendEngineBatch(nil, &wire.EngineBatch{Events: []kvevent.Event{e}}, form))
			if want == nil {
				if err != nil || len(b.Events) != 0 || b.Skipped != 1 {
					t.Fatalf("%s, form %+v: %v, %+v; want the event skipped", name, form, err, b)
				}
				continue
			}
			checkError(t, err, "engine batch", want, field, -2)
		}
	}
	f("negative block size", kvevent.Event{Kind: kvevent.Stored, BlockSize: -1}, wire.ErrInvalid, "events[0].block_size")
	f("unknown tier", kvevent.Event{Kind: kvevent.Removed, Tier: 9}, wire.ErrInvalid, "events[0].medium")
	f("MM not one per block", kvevent.Event{Kind: kvevent.Stored, Hashes: []uint64{1}, MM: [][]uint64{nil, {2}}}, wire.ErrInvalid, "events[0].extra_keys")
	f("unknown kind", kvevent.Event{Kind: 9}, nil, "")
}

// trtllmStored is a TensorRT-LLM BlockStored of one block of block size 4 whose last two
// positions hold the object identified by image, with mm_keys naming it when keys is true.
func trtllmStored(image string, keys bool) []byte {
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendFloat64(b, 1.5)
	b = msgp.AppendArrayHeader(b, 1)
	n := uint32(5)
	if keys {
		n++
	}
	b = msgp.AppendMapHeader(b, n)
	b = msgp.AppendString(b, "type")
	b = msgp.AppendString(b, "BlockStored")
	b = msgp.AppendString(b, "block_hashes")
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendInt64(b, -7)
	b = msgp.AppendString(b, "parent_block_hash")
	b = msgp.AppendNil(b)
	b = msgp.AppendString(b, "token_ids")
	b = msgp.AppendArrayHeader(b, 4)
	b = msgp.AppendInt(b, 1)
	b = msgp.AppendInt(b, 2)
	b = msgp.AppendString(b, image)
	b = msgp.AppendString(b, image)
	b = msgp.AppendString(b, "block_size")
	b = msgp.AppendInt(b, 4)
	if keys {
		b = msgp.AppendString(b, "mm_keys")
		b = msgp.AppendArrayHeader(b, 1)
		b = msgp.AppendArrayHeader(b, 1)
		b = msgp.AppendMapHeader(b, 3)
		b = msgp.AppendString(b, "type")
		b = msgp.AppendString(b, "mm_key")
		b = msgp.AppendString(b, "hash")
		b = msgp.AppendString(b, image)
		b = msgp.AppendString(b, "start_offset")
		b = msgp.AppendInt(b, 2)
	}
	return msgp.AppendInt(b, 0)
}

// TestEngineTRTLLMMultimodal: TensorRT-LLM's str token ids and mm_keys. Two images give two
// placeholders and two MM hashes, the same image the same; without mm_keys the placeholders
// alone tell the images apart; an identifier that is not 64 hex digits is hashed with XXH3.
func TestEngineTRTLLMMultimodal(t *testing.T) {
	imgA := "0123456789abcdef" + strings.Repeat("0", 48)
	imgB := "fedcba9876543210" + strings.Repeat("1", 48)
	f := func(image string, keys bool, wantPad uint32, wantMM [][]uint64) {
		t.Helper()
		var b wire.EngineBatch
		if err := b.Decode(trtllmStored(image, keys)); err != nil {
			t.Fatal(err)
		}
		e := b.Events[0]
		if want := []uint32{1, 2, wantPad, wantPad}; !slices.Equal(e.Tokens, want) {
			t.Fatalf("tokens %v, want %v", e.Tokens, want)
		}
		if len(e.MM) != len(wantMM) || len(wantMM) > 0 && !slices.Equal(e.MM[0], wantMM[0]) {
			t.Fatalf("MM %v, want %v", e.MM, wantMM)
		}
	}
	f(imgA, true, 1_000_000+0x09abcdef, [][]uint64{{0x0123456789abcdef}})
	f(imgB, true, 1_000_000+0x76543210&(1<<30-1), [][]uint64{{0xfedcba9876543210}})
	f(imgA, false, 1_000_000+0x09abcdef, nil)
	f("img-a", true, uint32(1_000_000+xxh3.HashString("img-a")&(1<<30-1)), [][]uint64{{xxh3.HashString("img-a")}})
}

// TestEngineTRTLLMInvalid: what cannot be read names its field.
func TestEngineTRTLLMInvalid(t *testing.T) {
	var b wire.EngineBatch
	checkError(t, b.Decode(trtllmStored("", false)), "engine batch", wire.ErrInvalid, "events[0].token_ids[2]", -2)
	p := trtllmStored("x", true)
	// mm_keys with two entries for one block.
	bad := bytes.Replace(p, append([]byte("\xa7mm_keys"), 0x91), append([]byte("\xa7mm_keys"), 0x92, 0xc0), 1)
	checkError(t, b.Decode(bad), "engine batch", wire.ErrInvalid, "events[0].mm_keys", -2)
	// A key without a hash.
	bad = bytes.Replace(p, []byte("\xa4hash"), []byte("\xa4hasH"), 1)
	checkError(t, b.Decode(bad), "engine batch", wire.ErrInvalid, "events[0].mm_keys[0][0]", -2)
}
