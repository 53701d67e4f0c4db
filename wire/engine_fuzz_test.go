package wire_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/kvrouterd/kvrouterd/wire"
)

// FuzzDecodeEngineBatch checks that Decode never panics on any payload and that whatever it
// accepts survives every encoder form: decode(encode(decode(x))) = decode(x), and the second
// encoding is the same bytes as the first. Decoding into a batch that held another payload
// gives the same result as into a fresh one. Seeds: the hand-written fixtures (real engine
// shapes) and encoded random batches.
func FuzzDecodeEngineBatch(f *testing.F) {
	prev := readHex(f, "engine/extra_keys_mm.hex")
	for _, g := range engineGoldens {
		f.Add(readHex(f, "engine/"+g.file))
	}
	for _, name := range []string{"replay_topic.hex", "replay_no_topic.hex"} {
		frames := readFrames(f, "engine/"+name)
		f.Add(frames[len(frames)-1])
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, form := range allForms {
		f.Add(wire.AppendEngineBatch(nil, randEngineBatch(r, 4, 3, 2, true), form))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		var fresh, reused wire.EngineBatch
		if err := reused.Decode(prev); err != nil {
			t.Fatal(err)
		}
		err := fresh.Decode(payload)
		err2 := reused.Decode(payload)
		if (err == nil) != (err2 == nil) || (err == nil && !sameEngine(&fresh, &reused)) {
			t.Fatalf("fresh: %v %+v\nreused: %v %+v", err, fresh, err2, reused)
		}
		if err != nil {
			return
		}
		want := fresh
		want.Skipped, want.Filtered, want.UnknownMedium, want.UnknownMediumName = 0, 0, 0, ""
		for _, form := range allForms {
			enc := wire.AppendEngineBatch(nil, &fresh, form)
			var again wire.EngineBatch
			if err := again.Decode(enc); err != nil {
				t.Fatalf("form %+v: re-encoded %x does not decode: %v", form, enc, err)
			}
			if !sameEngine(&again, &want) {
				t.Fatalf("form %+v: decode(encode(decode(x)))\n%+v\nwant\n%+v", form, again, want)
			}
			if enc2 := wire.AppendEngineBatch(nil, &again, form); !bytes.Equal(enc2, enc) {
				t.Fatalf("form %+v: encoded twice\n%x\n%x", form, enc2, enc)
			}
		}
	})
}
