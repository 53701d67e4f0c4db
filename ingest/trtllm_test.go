package ingest

import (
	"slices"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
)

// trtllmImageBatch is a TensorRT-LLM batch as its publisher writes it: one BlockStored, a tagged
// map, of a block of testBlock tokens whose last two positions hold image, given as str token
// ids and named in mm_keys.
func trtllmImageBatch(hash int64, image string) []byte {
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendFloat64(b, 1747000000.5)
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendMapHeader(b, 10)
	for _, kv := range [][2]string{{"type", "BlockStored"}, {"medium", "GPU"}} {
		b = msgp.AppendString(b, kv[0])
		b = msgp.AppendString(b, kv[1])
	}
	b = msgp.AppendString(b, "block_hashes")
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendInt64(b, hash)
	b = msgp.AppendString(b, "parent_block_hash")
	b = msgp.AppendNil(b)
	b = msgp.AppendString(b, "token_ids")
	b = msgp.AppendArrayHeader(b, testBlock)
	for i := range testBlock - 2 {
		b = msgp.AppendInt(b, 500+i)
	}
	b = msgp.AppendString(b, image)
	b = msgp.AppendString(b, image)
	b = msgp.AppendString(b, "block_size")
	b = msgp.AppendInt(b, testBlock)
	b = msgp.AppendString(b, "lora_id")
	b = msgp.AppendNil(b)
	b = msgp.AppendString(b, "lora_name")
	b = msgp.AppendNil(b)
	b = msgp.AppendString(b, "locality")
	b = msgp.AppendString(b, "local")
	b = msgp.AppendString(b, "mm_keys")
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendMapHeader(b, 4)
	b = msgp.AppendString(b, "type")
	b = msgp.AppendString(b, "mm_key")
	b = msgp.AppendString(b, "hash")
	b = msgp.AppendString(b, image)
	b = msgp.AppendString(b, "start_offset")
	b = msgp.AppendInt(b, testBlock-2)
	b = msgp.AppendString(b, "uuid")
	b = msgp.AppendString(b, "request-image")
	return msgp.AppendInt(b, 0)
}

// imageBlockSeq is the sequence hash a request's first block gets when its last two positions
// hold the image whose hash is h: Dynamo's placeholder token there, and h among the block's
// multimodal hashes.
func imageBlockSeq(h uint64) uint64 {
	tokens := make([]uint32, testBlock)
	for i := range testBlock - 2 {
		tokens[i] = uint32(500 + i)
	}
	pad := uint32(1_000_000 + h&(1<<30-1))
	tokens[testBlock-2], tokens[testBlock-1] = pad, pad
	var hs radix.Hasher
	local := hs.AppendLocalMM(nil, tokens, testBlock, radix.BaseSeed, [][]uint64{{h}})
	radix.ChainInPlace(local, 0, false)
	return local[0]
}

// TestSubscriberTRTLLMImages: TensorRT-LLM's payloads, str token ids and mm_keys included, from
// its PUB socket into the router: the block of an image is indexed under that image, so a
// request with the same image finds it and one with another image does not.
func TestSubscriberTRTLLMImages(t *testing.T) {
	imgA := "0123456789abcdef" + strings.Repeat("a", 48)
	const hashA, hashB = 0x0123456789abcdef, 0xfedcba9876543210
	eng := enginetest.Start(t, enginetest.Options{})
	rt := router.New(router.Config{Shards: 2, Logger: zmqTestLog()})
	defer rt.Close()
	sub := startSub(t, source(t, eng, 9, "m"), rt, EngineConfig{})
	r := eng.Rank(0)
	r.Probe(subReady(sub, 0))
	payload := trtllmImageBatch(-5, imgA)
	r.Send(nil, be8(r.Record(payload)), payload)
	held := func() []uint64 {
		if err := rt.Flush(); err != nil {
			t.Fatal(err)
		}
		var seqs []uint64
		for _, d := range rt.DumpWorker(9, nil) {
			seqs = append(seqs, d.Seq)
		}
		return seqs
	}
	eventually(t, "the image block applied", func() bool { return len(held()) == 1 })
	if got := held(); !slices.Contains(got, imageBlockSeq(hashA)) {
		t.Fatalf("worker holds %v, not the block of image A (%d)", got, imageBlockSeq(hashA))
	}
	if slices.Contains(held(), imageBlockSeq(hashB)) {
		t.Fatal("a request with image B would match image A's block")
	}
	if st := sub.Stats(); st.DecodeErrors != 0 {
		t.Fatalf("%d payloads refused", st.DecodeErrors)
	}
}
