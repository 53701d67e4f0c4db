package enginetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// The tests read the fake engine with plain zmq4 sockets, as a subscriber written against
// vLLM's publisher would, and check the frames byte for byte.

// reader receives from sock on a goroutine of its own until the test ends.
type reader struct {
	msgs chan zmq4.Msg
}

func read(t *testing.T, sock zmq4.Socket) *reader {
	r := &reader{msgs: make(chan zmq4.Msg, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := sock.Recv()
			if err != nil {
				return
			}
			r.msgs <- m
		}
	}()
	t.Cleanup(func() { sock.Close(); <-done })
	return r
}

// got reports whether a message arrived, without waiting.
func (r *reader) got() bool { return len(r.msgs) > 0 }

// next waits for the next message; the deadline only bounds a broken build.
func (r *reader) next(t *testing.T) [][]byte {
	t.Helper()
	select {
	case m := <-r.msgs:
		return m.Frames
	case <-time.After(20 * time.Second):
		t.Fatal("no message")
		return nil
	}
}

func subscribe(t *testing.T, endpoint string) *reader {
	t.Helper()
	sub := zmq4.NewSub(context.Background())
	if err := sub.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	return read(t, sub)
}

func checkFrames(t *testing.T, got [][]byte, want ...[]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d frames %q, want %d %q", len(got), got, len(want), want)
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d: %x, want %x", i, got[i], want[i])
		}
	}
}

func stored(parent uint64, hashes ...uint64) kvevent.Event {
	var toks []uint32
	for _, h := range hashes {
		toks = append(toks, uint32(h), uint32(h)+1)
	}
	return kvevent.Event{Kind: kvevent.Stored, Hashes: hashes, Parent: parent, HasParent: parent != 0, BlockSize: 2, Tokens: toks}
}

// TestLive: rank r publishes on port + r, each batch as [topic, seq, payload] numbered from 0,
// and a restarted rank numbers from 0 again on the same port.
func TestLive(t *testing.T) {
	e := Start(t, Options{Ranks: 3, Topic: "kv"})
	for i := range e.Ranks() {
		if want := fmt.Sprintf("tcp://127.0.0.1:%d", e.Port()+i); e.Rank(i).Endpoint() != want {
			t.Fatalf("rank %d on %s, want %s", i, e.Rank(i).Endpoint(), want)
		}
	}
	r := e.Rank(2)
	sub := subscribe(t, r.Endpoint())
	r.Probe(sub.got)
	probe := wire.AppendEngineBatch(nil, &wire.EngineBatch{TS: 1}, wire.EngineForm{})
	checkFrames(t, sub.next(t), []byte("kv"), make([]byte, 8), probe)
	// next skips the probe's repeats, which may still be on their way.
	next := func() [][]byte {
		t.Helper()
		for {
			m := sub.next(t)
			if len(m) != 3 || !bytes.Equal(m[1], make([]byte, 8)) {
				return m
			}
			checkFrames(t, m, []byte("kv"), make([]byte, 8), probe)
		}
	}

	for _, f := range Forms() {
		b := r.Batch(stored(0, 1<<63|5, 6), kvevent.Event{Kind: kvevent.Cleared})
		seq := r.Publish(b, f.EngineForm)
		checkFrames(t, next(), []byte("kv"), SeqFrame(seq), wire.AppendEngineBatch(nil, b, f.EngineForm))
		var back wire.EngineBatch
		if err := back.Decode(wire.AppendEngineBatch(nil, b, f.EngineForm)); err != nil || !back.HasRank || back.Rank != 2 || len(back.Events) != 2 {
			t.Fatalf("%s: decodes as %+v, %v", f.Name, back, err)
		}
	}
	if r.Next() != 1+uint64(len(Forms())) {
		t.Fatalf("next sequence %d", r.Next())
	}
	// A dropped batch takes its sequence: the next one published shows the gap.
	dropped := r.Drop(r.Batch(stored(0, 7)), SGLang.EngineForm)
	seq := r.Publish(r.Batch(stored(0, 8)), SGLang.EngineForm)
	if got := next(); seq != dropped+1 || !bytes.Equal(got[1], SeqFrame(seq)) {
		t.Fatalf("after dropping %d: got sequence %x, want %d", dropped, got[1], dropped+1)
	}

	r.Restart()
	again := subscribe(t, r.Endpoint())
	b := r.Batch(stored(0, 9))
	r.PublishUntil(b, VLLMMap.EngineForm, again.got)
	checkFrames(t, again.next(t), []byte("kv"), SeqFrame(0), wire.AppendEngineBatch(nil, b, VLLMMap.EngineForm))
	if r.Next() != 1 {
		t.Fatalf("next sequence after a restart %d, want 1", r.Next())
	}
}

// TestReplay: a DEALER's request ["", start] gets ["", seq, payload] for every kept batch from
// start on, dropped ones included, then ["", ff×8, ""]; with ReplyTopic the topic comes before
// the sequence. Forget ends the buffer's reach; Restart empties it.
func TestReplay(t *testing.T) {
	for _, topic := range []bool{false, true} {
		t.Run(fmt.Sprintf("replyTopic=%v", topic), func(t *testing.T) {
			e := Start(t, Options{Ranks: 2, Replay: true, ReplyTopic: topic, Topic: "kv"})
			r := e.Rank(1)
			if want := fmt.Sprintf("tcp://127.0.0.1:%d", e.ReplayPort()+1); r.ReplayEndpoint() != want {
				t.Fatalf("rank 1 replays on %s, want %s", r.ReplayEndpoint(), want)
			}
			var payloads [][]byte
			for i := range 4 {
				b := r.Batch(stored(0, uint64(10+i)))
				if i == 2 {
					r.Drop(b, VLLMArray.EngineForm)
				} else {
					r.Publish(b, VLLMArray.EngineForm)
				}
				p, ok := r.Payload(uint64(i))
				if !ok || !bytes.Equal(p, wire.AppendEngineBatch(nil, b, VLLMArray.EngineForm)) {
					t.Fatalf("batch %d kept as %x, %v", i, p, ok)
				}
				payloads = append(payloads, p)
			}
			// ask sends a request on a new connection, as a subscriber does for each gap.
			ask := func(start uint64, want ...uint64) {
				t.Helper()
				d := zmq4.NewDealer(context.Background())
				if err := d.Dial(r.ReplayEndpoint()); err != nil {
					t.Fatal(err)
				}
				replies := read(t, d)
				if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, SeqFrame(start))); err != nil {
					t.Fatal(err)
				}
				reply := func(seq, payload []byte) [][]byte {
					if topic {
						return [][]byte{{}, []byte("kv"), seq, payload}
					}
					return [][]byte{{}, seq, payload}
				}
				for _, seq := range want {
					checkFrames(t, replies.next(t), reply(SeqFrame(seq), payloads[seq])...)
				}
				checkFrames(t, replies.next(t), reply([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, []byte{})...)
			}
			ask(1, 1, 2, 3)
			ask(9)
			r.Forget(2)
			ask(0, 2, 3)
			r.Restart()
			ask(0)
		})
	}
}

// TestEndpoints: the --zmq flag and Dynamo's /register body name the ranks' sockets.
func TestEndpoints(t *testing.T) {
	e := Start(t, Options{Ranks: 2, Replay: true, Topic: "kv"})
	want := fmt.Sprintf("worker=7,model=m,endpoint=tcp://127.0.0.1:%d,replay=tcp://127.0.0.1:%d,ranks=2,topic=kv", e.Port(), e.ReplayPort())
	if got := e.ZMQFlag(7, "m"); got != want {
		t.Fatalf("flag %q, want %q", got, want)
	}
	if got, want := Start(t, Options{}).ZMQFlag(1, "m"), "worker=1,model=m,endpoint="; len(got) < len(want) || got[:len(want)] != want {
		t.Fatalf("flag %q", got)
	}
	var reg map[string]any
	if err := json.Unmarshal([]byte(e.Rank(1).Registration(7, "m", 16)), &reg); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(reg) != fmt.Sprintf("map[block_size:16 dp_rank:1 endpoint:tcp://127.0.0.1:%d instance_id:7 model_name:m replay_endpoint:tcp://127.0.0.1:%d]", e.Port()+1, e.ReplayPort()+1) {
		t.Fatalf("registration %v", reg)
	}
}
