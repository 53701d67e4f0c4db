package ingest

import (
	"context"
	"encoding/json"
	"strconv"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Header names of event messages.
const (
	// HeaderRank is the data-parallel rank of an engine batch that does not state one.
	HeaderRank = "Kvr-Rank"
	// HeaderEngineSeq is the engine's ZMQ batch sequence a bridge forwarded (informational).
	HeaderEngineSeq = "Kvr-Engine-Seq"
)

// Publisher publishes events and load reports on kvrouterd's subjects: for bridges, tests,
// benchmarks and publishers written in Go. Safe for concurrent use.
type Publisher struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	prefix string
}

// NewPublisher publishes through nc under prefix (DefaultPrefix if empty).
func NewPublisher(nc *nats.Conn, prefix string) (*Publisher, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Publisher{nc: nc, js: js, prefix: prefix}, nil
}

// Batch publishes a binary event batch and returns its stream sequence once stored.
func (p *Publisher) Batch(ctx context.Context, b *wire.EventBatch) (uint64, error) {
	if err := b.Validate(); err != nil {
		return 0, err
	}
	ack, err := p.js.Publish(ctx, EventSubject(p.prefix, b.Model, b.Worker), wire.AppendEventBatch(nil, b))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// BatchAsync is Batch without waiting for the store: for publishers that, like engines, do not
// wait on the bus. Wait on the returned future, or on PublishAsyncComplete.
func (p *Publisher) BatchAsync(b *wire.EventBatch) (jetstream.PubAckFuture, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	return p.js.PublishAsync(EventSubject(p.prefix, b.Model, b.Worker), wire.AppendEventBatch(nil, b))
}

// Engine publishes an engine's msgpack batch as it came off ZMQ. rank < 0 sets no rank header;
// engineSeq < 0 sets no sequence header.
func (p *Publisher) Engine(ctx context.Context, model string, worker uint64, rank int64, engineSeq int64, payload []byte) (uint64, error) {
	m := p.engineMsg(model, worker, rank, engineSeq, payload)
	ack, err := p.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// EngineAsync is Engine without waiting for the store: for high rates. Wait on the returned
// future, or on PublishAsyncComplete.
func (p *Publisher) EngineAsync(model string, worker uint64, rank int64, engineSeq int64, payload []byte) (jetstream.PubAckFuture, error) {
	return p.js.PublishMsgAsync(p.engineMsg(model, worker, rank, engineSeq, payload))
}

// PublishAsyncComplete is closed when every asynchronous publish so far is acknowledged.
func (p *Publisher) PublishAsyncComplete() <-chan struct{} { return p.js.PublishAsyncComplete() }

func (p *Publisher) engineMsg(model string, worker uint64, rank int64, engineSeq int64, payload []byte) *nats.Msg {
	m := nats.NewMsg(EventSubject(p.prefix, model, worker))
	m.Data = payload
	if rank >= 0 {
		m.Header.Set(HeaderRank, strconv.FormatInt(rank, 10))
	}
	if engineSeq >= 0 {
		m.Header.Set(HeaderEngineSeq, strconv.FormatInt(engineSeq, 10))
	}
	return m
}

// Report publishes a load report (plain NATS: reports are not kept in the stream).
func (p *Publisher) Report(rep *router.LoadReport) error {
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	return p.nc.Publish(LoadSubject(p.prefix, rep.Model, rep.Worker), b)
}
