package mocker

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/wire"
)

const (
	// replayKeep is how many batches the replay socket serves, vLLM's buffer_steps default.
	replayKeep = 10000
	// pubHWM is the messages a PUB socket queues before it drops, vLLM's default.
	pubHWM = 100000
)

// seqEnd is the replay's end marker: sequence -1 as 8 bytes.
var seqEnd = binary.BigEndian.AppendUint64(nil, wire.EngineSeqEnd)

// publisher publishes the engine's KV events as vLLM's ZmqEventPublisher does: one message
// [topic "", seq 8 bytes big-endian, msgpack payload] per batch on a PUB socket, seq counting
// batches from 0, and, with a replay socket, the last replayKeep batches for DEALERs that ask
// ["", start 8 bytes big-endian]. publish is for the engine goroutine; the replay socket is
// served by a goroutine of its own, which shares only the kept batches, under mu.
type publisher struct {
	form  wire.EngineForm
	pub   zmq4.Socket
	rt    zmq4.Socket // nil without replay
	log   *slog.Logger
	batch wire.EngineBatch // engine goroutine only
	next  uint64           // sequence of the next batch; engine goroutine only

	mu   sync.Mutex
	kept []keptBatch // a ring of at most replayKeep; REQUIRES mu
	head int         // the oldest of kept once it is full; REQUIRES mu

	served chan struct{} // closed when the replay goroutine is gone
}

type keptBatch struct {
	seq     uint64
	payload []byte
}

// listenEvents binds the PUB socket at pubAddr and, unless replayAddr is empty, the replay
// ROUTER socket at replayAddr.
func listenEvents(pubAddr, replayAddr string, form wire.EngineForm, log *slog.Logger) (*publisher, error) {
	p := &publisher{form: form, log: log, served: make(chan struct{})}
	p.pub = zmq4.NewPub(context.Background())
	if err := p.pub.SetOption(zmq4.OptionHWM, pubHWM); err != nil {
		p.pub.Close()
		return nil, fmt.Errorf("mocker: KV events socket: %w", err)
	}
	if err := p.pub.Listen(pubAddr); err != nil {
		p.pub.Close()
		return nil, fmt.Errorf("mocker: KV events on %s: %w", pubAddr, err)
	}
	if replayAddr == "" {
		close(p.served)
		return p, nil
	}
	p.rt = zmq4.NewRouter(context.Background())
	if err := p.rt.Listen(replayAddr); err != nil {
		p.rt.Close()
		p.pub.Close()
		return nil, fmt.Errorf("mocker: replay socket on %s: %w", replayAddr, err)
	}
	go p.serveReplay()
	return p, nil
}

// publishStep publishes the step's events as one batch; a step without events publishes
// nothing, as vLLM's scheduler does.
func (p *publisher) publishStep(out *sim.StepOutput) {
	if len(out.Events) == 0 {
		return
	}
	p.batch = wire.EngineBatch{TS: float64(time.Now().UnixMicro()) / 1e6, HasRank: true, Events: out.Events}
	// A new buffer each time: the PUB socket's queue and the replay ring keep it.
	payload := wire.AppendEngineBatch(nil, &p.batch, p.form)
	p.batch.Events = nil
	seq := p.next
	p.next++
	p.mu.Lock()
	if len(p.kept) < replayKeep {
		p.kept = append(p.kept, keptBatch{seq, payload})
	} else {
		p.kept[p.head] = keptBatch{seq, payload}
		p.head = (p.head + 1) % replayKeep
	}
	p.mu.Unlock()
	seqFrame := binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
	if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte{}, seqFrame, payload)); err != nil {
		p.log.Warn("KV event batch not sent", "seq", seq, "err", err)
	}
}

// serveReplay answers replay requests until the socket is closed: every kept batch whose
// sequence is at least the one asked for, in order, then the end marker.
func (p *publisher) serveReplay() {
	defer close(p.served)
	for {
		msg, err := p.rt.Recv()
		if err != nil {
			return // closed
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 0 || len(msg.Frames[2]) != 8 {
			p.log.Debug("replay request ignored", "frames", len(msg.Frames))
			continue
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		var out []keptBatch
		p.mu.Lock()
		for i := range p.kept {
			b := p.kept[(p.head+i)%len(p.kept)]
			if b.seq >= start {
				out = append(out, b)
			}
		}
		p.mu.Unlock()
		p.log.Debug("replay", "from", start, "batches", len(out))
		for _, b := range out {
			seq := binary.BigEndian.AppendUint64(make([]byte, 0, 8), b.seq)
			if err := p.rt.SendMulti(zmq4.NewMsgFrom(id, []byte{}, seq, b.payload)); err != nil {
				break
			}
		}
		_ = p.rt.SendMulti(zmq4.NewMsgFrom(id, []byte{}, seqEnd, []byte{}))
	}
}

// endpoints are the PUB and replay endpoints as a subscriber dials them.
func (p *publisher) endpoints(host string) (pub, replay string) {
	pub = endpoint("tcp://", p.pub.Addr(), host)
	if p.rt != nil {
		replay = endpoint("tcp://", p.rt.Addr(), host)
	}
	return pub, replay
}

func (p *publisher) close() {
	p.pub.Close()
	if p.rt != nil {
		p.rt.Close()
	}
	<-p.served
}

// endpoint is scheme + host:port of a bound address: with host, or else the address's own
// host, 127.0.0.1 for a wildcard (one that binds every interface).
func endpoint(scheme string, a net.Addr, host string) string {
	h, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return scheme + a.String()
	}
	if host == "" {
		host = h
		if ip := net.ParseIP(h); h == "" || ip != nil && ip.IsUnspecified() {
			host = "127.0.0.1"
		}
	}
	return scheme + net.JoinHostPort(host, port)
}
