package enginetest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// Form is an engine release's payload layout: a name for test output and the wire.EngineForm
// that writes it. A plain value.
type Form struct {
	Name string
	wire.EngineForm
}

// The forms engines publish; the package documentation says which release sends which.
var (
	VLLMArray     = Form{"vllm-array", wire.EngineForm{}}
	VLLMMapEvents = Form{"vllm-map-events", wire.EngineForm{MapEvents: true}}
	VLLMMap       = Form{"vllm-map", wire.EngineForm{MapBatch: true, MapEvents: true}}
	SGLang        = Form{"sglang", wire.EngineForm{Hashes: wire.HashInt64}}
)

// Forms returns every Form above, oldest vLLM first, for tests run once per form.
func Forms() []Form { return []Form{VLLMArray, VLLMMapEvents, VLLMMap, SGLang} }

// Options configures an Engine. A plain value; the zero value is one rank without replay.
type Options struct {
	// Ranks is the number of data-parallel ranks (0 counts as 1): rank r binds Port + r.
	Ranks int
	// Replay gives every rank a replay ROUTER socket, rank r on ReplayPort + r.
	Replay bool
	// ReplyTopic makes replay replies [topic, seq, payload] rather than the engines'
	// [seq, payload], for readers that accept both.
	ReplyTopic bool
	// Topic is the first frame of every live message.
	Topic string
}

// Engine is a fake engine's KV-event publishers, one Rank per data-parallel rank, bound on
// 127.0.0.1. For one goroutine, the test's (see the package documentation).
type Engine struct {
	tb               testing.TB
	topic            string
	ranks            []*Rank
	port, replayPort int
}

// Start binds o.Ranks PUB sockets on consecutive free ports of 127.0.0.1 and, with o.Replay,
// as many ROUTER sockets on another run of them; the engine is closed when tb's test ends.
func Start(tb testing.TB, o Options) *Engine {
	tb.Helper()
	if o.Ranks <= 0 {
		o.Ranks = 1
	}
	e := &Engine{tb: tb, topic: o.Topic}
	pubs, port := listenRun(tb, o.Ranks, newPub)
	e.port = port
	var routers []zmq4.Socket
	if o.Replay {
		routers, e.replayPort = listenRun(tb, o.Ranks, newRouter)
	}
	for i := range o.Ranks {
		r := &Rank{tb: tb, rank: i, topic: o.Topic, pub: pubs[i], pubAddr: pubs[i].Addr().String(), replyTopic: o.ReplyTopic}
		if o.Replay {
			r.routerAddr = routers[i].Addr().String()
			r.serve(routers[i])
		}
		e.ranks = append(e.ranks, r)
	}
	tb.Cleanup(e.Close)
	return e
}

func newPub() zmq4.Socket    { return zmq4.NewPub(context.Background()) }
func newRouter() zmq4.Socket { return zmq4.NewRouter(context.Background()) }

// listenRun binds n sockets made by mk to consecutive free ports of 127.0.0.1 and returns
// them with the first port.
func listenRun(tb testing.TB, n int, mk func() zmq4.Socket) ([]zmq4.Socket, int) {
	tb.Helper()
	for range 100 {
		first := mk()
		if err := first.Listen("tcp://127.0.0.1:0"); err != nil {
			tb.Fatal(err)
		}
		port := first.Addr().(*net.TCPAddr).Port
		socks := []zmq4.Socket{first}
		for r := 1; r < n; r++ {
			s := mk()
			if port+r > 65535 || s.Listen(fmt.Sprintf("tcp://127.0.0.1:%d", port+r)) != nil {
				s.Close()
				break
			}
			socks = append(socks, s)
		}
		if len(socks) == n {
			return socks, port
		}
		for _, s := range socks {
			s.Close()
		}
	}
	tb.Fatalf("enginetest: found no %d consecutive free ports", n)
	return nil, 0
}

// Close closes every rank's sockets; Start has tb's cleanup call it.
func (e *Engine) Close() {
	for _, r := range e.ranks {
		r.Stop()
	}
}

// Rank returns data-parallel rank i.
func (e *Engine) Rank(i int) *Rank { return e.ranks[i] }

// Ranks is the number of data-parallel ranks.
func (e *Engine) Ranks() int { return len(e.ranks) }

// Port is rank 0's PUB port; rank r's is Port + r.
func (e *Engine) Port() int { return e.port }

// ReplayPort is rank 0's replay port (rank r's is ReplayPort + r), 0 without replay.
func (e *Engine) ReplayPort() int { return e.replayPort }

// Endpoint is rank 0's PUB endpoint, as an engine is configured with it (tcp://host:port).
func (e *Engine) Endpoint() string { return e.ranks[0].Endpoint() }

// ReplayEndpoint is rank 0's replay endpoint, "" without replay.
func (e *Engine) ReplayEndpoint() string { return e.ranks[0].ReplayEndpoint() }

// ZMQFlag is the --zmq value (ingest.ParseEngineSource's form) that subscribes worker of
// model to every rank of e.
func (e *Engine) ZMQFlag(worker uint64, model string) string {
	s := fmt.Sprintf("worker=%d,model=%s,endpoint=%s", worker, model, e.Endpoint())
	if e.replayPort != 0 {
		s += ",replay=" + e.ReplayEndpoint()
	}
	if len(e.ranks) > 1 {
		s += ",ranks=" + strconv.Itoa(len(e.ranks))
	}
	if e.topic != "" {
		s += ",topic=" + e.topic
	}
	return s
}

// Rank is one data-parallel rank's publisher: a PUB socket and, with replay, a ROUTER socket
// and the buffer it replays. For one goroutine, the test's.
type Rank struct {
	tb         testing.TB
	rank       int
	topic      string
	replyTopic bool
	pubAddr    string // host:port, kept across Stop and Start
	routerAddr string // "" without replay

	pub    zmq4.Socket // nil while stopped
	router zmq4.Socket // nil while stopped or without replay
	served chan struct{}
	next   uint64 // sequence of the next batch

	mu     sync.Mutex // shared with the replay goroutine
	buf    []batch    // the replay buffer; REQUIRES mu
	forget uint64     // batches before it are no longer replayed; REQUIRES mu
	silent bool       // requests are read and never answered; REQUIRES mu
}

type batch struct {
	seq     uint64
	payload []byte
}

// DPRank is the rank's data-parallel rank.
func (r *Rank) DPRank() int { return r.rank }

// Endpoint is the rank's PUB endpoint, tcp://127.0.0.1:port.
func (r *Rank) Endpoint() string { return "tcp://" + r.pubAddr }

// ReplayEndpoint is the rank's replay endpoint, "" without replay.
func (r *Rank) ReplayEndpoint() string {
	if r.routerAddr == "" {
		return ""
	}
	return "tcp://" + r.routerAddr
}

// Registration is the JSON body of Dynamo's POST /register for this rank of worker: its own
// endpoint and replay endpoint, dp_rank, and blockSize.
func (r *Rank) Registration(worker uint64, model string, blockSize int) string {
	b, err := json.Marshal(struct {
		Instance  uint64 `json:"instance_id"`
		Endpoint  string `json:"endpoint"`
		Replay    string `json:"replay_endpoint,omitempty"`
		Model     string `json:"model_name"`
		BlockSize int    `json:"block_size"`
		Rank      int    `json:"dp_rank"`
	}{worker, r.Endpoint(), r.ReplayEndpoint(), model, blockSize, r.rank})
	if err != nil {
		r.tb.Fatal(err)
	}
	return string(b)
}

// Batch is a batch of evs as the engines publish it: stamped now, with the rank's
// data_parallel_rank (vLLM) or attn_dp_rank (SGLang).
func (r *Rank) Batch(evs ...kvevent.Event) *wire.EngineBatch {
	return &wire.EngineBatch{TS: float64(time.Now().UnixMicro()) / 1e6, Rank: uint32(r.rank), HasRank: true, Events: evs}
}

// Next is the sequence the next batch will carry.
func (r *Rank) Next() uint64 { return r.next }

// Publish publishes b in form f and returns its sequence.
func (r *Rank) Publish(b *wire.EngineBatch, f wire.EngineForm) uint64 {
	r.tb.Helper()
	payload := wire.AppendEngineBatch(nil, b, f)
	seq := r.Record(payload)
	r.Send([]byte(r.topic), SeqFrame(seq), payload)
	return seq
}

// PublishUntil publishes b in form f and sends it again every 2 ms until until holds, for the
// first batch after a subscriber (re)connects, which the PUB socket may drop; the repeats
// carry the same sequence, so a subscriber takes them for duplicates. It returns the sequence.
func (r *Rank) PublishUntil(b *wire.EngineBatch, f wire.EngineForm, until func() bool) uint64 {
	r.tb.Helper()
	payload := wire.AppendEngineBatch(nil, b, f)
	seq := r.Record(payload)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		r.Send([]byte(r.topic), SeqFrame(seq), payload)
		if until() {
			return seq
		}
		if time.Now().After(deadline) {
			r.tb.Fatalf("enginetest: rank %d: batch %d never reached the subscriber", r.rank, seq)
		}
	}
}

// Probe publishes an empty batch as the rank's first, until ready: the subscription has reached
// the PUB socket, and from then on TCP delivers every batch in order.
func (r *Rank) Probe(ready func() bool) {
	r.tb.Helper()
	if r.next != 0 {
		r.tb.Fatalf("enginetest: rank %d: probe after batch %d", r.rank, r.next-1)
	}
	r.PublishUntil(&wire.EngineBatch{TS: 1}, wire.EngineForm{}, ready)
}

// Drop numbers b in form f and keeps it for replay without publishing it: a batch the PUB
// socket dropped. It returns the sequence.
func (r *Rank) Drop(b *wire.EngineBatch, f wire.EngineForm) uint64 {
	return r.Record(wire.AppendEngineBatch(nil, b, f))
}

// Record numbers payload and keeps it for replay, as the publisher does once it has sent a
// batch; it returns the sequence. Send then sends it, or not.
func (r *Rank) Record(payload []byte) uint64 {
	seq := r.next
	r.next++
	r.mu.Lock()
	r.buf = append(r.buf, batch{seq, payload})
	r.mu.Unlock()
	return seq
}

// Send sends frames as one message on the PUB socket, whatever they hold.
func (r *Rank) Send(frames ...[]byte) {
	r.tb.Helper()
	if r.pub == nil {
		r.tb.Fatalf("enginetest: rank %d: send while stopped", r.rank)
	}
	if err := r.pub.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		r.tb.Fatal(err)
	}
}

// Payload is the payload of batch seq in the replay buffer.
func (r *Rank) Payload(seq uint64) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.buf {
		if b.seq == seq {
			return b.payload, true
		}
	}
	return nil, false
}

// Forget makes the batches before seq leave the replay buffer, as they do once buffer_steps
// newer ones were published.
func (r *Rank) Forget(seq uint64) {
	r.mu.Lock()
	r.forget = seq
	r.mu.Unlock()
}

// Silence makes the replay socket read requests and never answer them.
func (r *Rank) Silence() {
	r.mu.Lock()
	r.silent = true
	r.mu.Unlock()
}

// ResetSeq makes the next batch number 0 again on the same sockets, with an empty replay
// buffer: an engine restart that the subscriber's connection did not notice.
func (r *Rank) ResetSeq() {
	r.next = 0
	r.mu.Lock()
	r.buf, r.forget = nil, 0
	r.mu.Unlock()
}

// Stop closes the rank's sockets, as an engine process that exits does. Stopping a stopped
// rank does nothing.
func (r *Rank) Stop() {
	if r.pub != nil {
		r.pub.Close()
		r.pub = nil
	}
	if r.router != nil {
		r.router.Close()
		<-r.served
		r.router = nil
	}
}

// Start binds the rank's sockets again on their ports, as a new engine process does: it numbers
// its batches from 0 and its replay buffer starts empty. Starting a started rank does nothing.
func (r *Rank) Start() {
	r.tb.Helper()
	if r.pub != nil {
		return
	}
	r.ResetSeq()
	pub := newPub()
	if err := pub.Listen("tcp://" + r.pubAddr); err != nil {
		r.tb.Fatalf("enginetest: rank %d: PUB on %s again: %v", r.rank, r.pubAddr, err)
	}
	r.pub = pub
	if r.routerAddr != "" {
		rt := newRouter()
		if err := rt.Listen("tcp://" + r.routerAddr); err != nil {
			r.tb.Fatalf("enginetest: rank %d: ROUTER on %s again: %v", r.rank, r.routerAddr, err)
		}
		r.serve(rt)
	}
}

// Restart is Stop then Start: a new engine process on the same ports.
func (r *Rank) Restart() {
	r.tb.Helper()
	r.Stop()
	r.Start()
}

// serve answers replay requests on rt from a goroutine of its own until rt is closed.
func (r *Rank) serve(rt zmq4.Socket) {
	r.router = rt
	r.served = make(chan struct{})
	go r.serveReplay(rt, r.served)
}

// serveReplay answers replay requests as the engines do: every kept batch from the requested
// sequence on, then the end marker.
func (r *Rank) serveReplay(rt zmq4.Socket, served chan<- struct{}) {
	defer close(served)
	for {
		msg, err := rt.Recv()
		if err != nil {
			return // closed
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		r.mu.Lock()
		var out []batch
		for _, b := range r.buf {
			if b.seq >= start && b.seq >= r.forget {
				out = append(out, b)
			}
		}
		silent := r.silent
		r.mu.Unlock()
		if silent {
			continue
		}
		reply := func(seq []byte, payload []byte) {
			frames := [][]byte{id, {}}
			if r.replyTopic {
				frames = append(frames, []byte(r.topic))
			}
			_ = rt.SendMulti(zmq4.NewMsgFrom(append(frames, seq, payload)...))
		}
		for _, b := range out {
			reply(SeqFrame(b.seq), b.payload)
		}
		reply(SeqFrame(wire.EngineSeqEnd), []byte{})
	}
}

// SeqFrame is seq as the engines send it: 8 bytes, big-endian.
func SeqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }
