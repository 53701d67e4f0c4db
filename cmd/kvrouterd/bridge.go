package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"

	"github.com/kvrouterd/kvrouterd/daemon"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/nats-io/nats.go"
)

// bridgeConfig configures `kvrouterd bridge`: it runs beside an engine and forwards its ZMQ KV
// events into the JetStream stream, so that every router replica reads one durable, ordered
// stream.
type bridgeConfig struct {
	ZMQ        []ingest.EngineSource
	NATSURL    string
	NATS       daemon.NATSAuth
	NATSPrefix string
	LogLevel   string
	LogFormat  string
	ZMQLimits  daemon.ZMQLimits
	// ClearOnGap publishes a clear of the worker when batches are lost for good; false keeps
	// its blocks in the stream's consumers, as Dynamo does (daemon.Config.ClearOnGap).
	ClearOnGap bool
}

func parseBridgeConfig(args []string, env func(string) (string, bool), out io.Writer) (bridgeConfig, error) {
	c := bridgeConfig{NATSURL: "nats://127.0.0.1:4222", NATSPrefix: ingest.DefaultPrefix, LogLevel: "info", LogFormat: "text",
		ZMQLimits: daemon.DefaultZMQLimits()}
	fs := flag.NewFlagSet("kvrouterd bridge", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Var(&daemon.SourceList{P: &c.ZMQ}, "zmq", "the engine's ZMQ KV events: worker=ID,model=NAME,endpoint=tcp://host:port[,replay=tcp://host:port][,ranks=N][,rank=R][,topic=T]; repeat for several engines")
	fs.StringVar(&c.NATSURL, "nats-url", c.NATSURL, "NATS server or cluster holding the router's stream (comma-separated URLs)")
	c.NATS.Flags(fs)
	fs.StringVar(&c.NATSPrefix, "nats-subject-prefix", c.NATSPrefix, "first token of the event subjects, as the routers use it")
	c.ZMQLimits.Flags(fs)
	fs.BoolVar(&c.ClearOnGap, "clear-on-gap", c.ClearOnGap, "when batches are lost for good (a gap the engine's replay socket cannot return), publish a clear of the worker before its next batch; off (the default) keeps its blocks and goes on, as Dynamo does")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	if err := parseFlags(fs, args, env, out, "kvrouterd bridge: forward an engine's ZMQ KV events into kvrouterd's NATS JetStream stream.\n\n"+
		"Usage: kvrouterd bridge --zmq worker=7,model=llama,endpoint=tcp://127.0.0.1:5557 --nats-url nats://router:4222", nil); err != nil {
		return c, err
	}
	switch {
	case len(c.ZMQ) == 0:
		return c, fmt.Errorf("--zmq: name at least one engine")
	case c.NATSURL == "":
		return c, fmt.Errorf("--nats-url: empty")
	}
	if err := daemon.CheckPrefix(c.NATSPrefix); err != nil {
		return c, err
	}
	if err := c.NATS.Check(); err != nil {
		return c, err
	}
	if err := c.ZMQLimits.Check(); err != nil {
		return c, err
	}
	if err := daemon.CheckLog(c.LogLevel, c.LogFormat); err != nil {
		return c, err
	}
	return c, nil
}

// runBridge forwards until ctx ends.
func runBridge(ctx context.Context, c bridgeConfig, stderr io.Writer) error {
	log := daemon.NewLogger(stderr, c.LogLevel, c.LogFormat)
	nc, err := nats.Connect(c.NATSURL, append(ingest.ConnectOptions(log), c.NATS.Options()...)...)
	if err != nil {
		return fmt.Errorf("nats %s: %w", c.NATSURL, err)
	}
	defer nc.Close()
	pub, err := ingest.NewPublisher(nc, c.NATSPrefix)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(c.ZMQ))
	for i, src := range c.ZMQ {
		b, err := ingest.NewBridge(src, pub, c.ZMQLimits.Apply(ingest.EngineConfig{Logger: log.With("worker", src.Worker), KeepOnGap: !c.ClearOnGap}))
		if err != nil {
			return err
		}
		log.Info("bridging", "source", src.String(), "nats", c.NATSURL)
		wg.Go(func() { errs[i] = b.Run(ctx) })
	}
	wg.Wait()
	if err := nc.Flush(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		log.Warn("nats flush at exit", "err", err)
	}
	return errors.Join(errs...)
}
