package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"

	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/nats-io/nats.go"
)

// bridgeConfig configures `kvrouterd bridge`: it runs beside an engine and forwards its ZMQ KV
// events into the JetStream stream, so that every router replica reads one durable, ordered
// stream.
type bridgeConfig struct {
	ZMQ        []ingest.EngineSource
	NATSURL    string
	NATS       natsAuth
	NATSPrefix string
	LogLevel   string
	LogFormat  string
	ZMQLimits  zmqLimits
}

// natsAuth is how a connection to a NATS server authenticates: an external one, or another
// kvrouterd's embedded one (UserFile).
type natsAuth struct {
	Creds, UserFile, TLSCA, TLSCert, TLSKey string
}

func (a *natsAuth) flags(fs *flag.FlagSet) {
	fs.StringVar(&a.Creds, "nats-creds", a.Creds, "credentials file (JWT and NKey) for the NATS server")
	fs.StringVar(&a.UserFile, "nats-user-file", a.UserFile, "file holding one line user:password for the NATS server, such as a kvrouterd's --data-dir/nats/publisher.auth")
	fs.StringVar(&a.TLSCA, "nats-tls-ca", a.TLSCA, "CA certificate file to verify the NATS servers")
	fs.StringVar(&a.TLSCert, "nats-tls-cert", a.TLSCert, "client certificate file (with --nats-tls-key)")
	fs.StringVar(&a.TLSKey, "nats-tls-key", a.TLSKey, "client key file")
}

func (a *natsAuth) check() error {
	if (a.TLSCert == "") != (a.TLSKey == "") {
		return fmt.Errorf("--nats-tls-cert and --nats-tls-key go together")
	}
	if a.Creds != "" && a.UserFile != "" {
		return fmt.Errorf("--nats-creds and --nats-user-file: give one")
	}
	if a.UserFile != "" {
		if _, err := ingest.ReadUserFile(a.UserFile); err != nil {
			return fmt.Errorf("--nats-user-file: %w", err)
		}
	}
	return nil
}

func (a *natsAuth) options() []nats.Option {
	var opts []nats.Option
	if a.Creds != "" {
		opts = append(opts, nats.UserCredentials(a.Creds))
	}
	if a.UserFile != "" {
		opts = append(opts, ingest.UserFile(a.UserFile))
	}
	if a.TLSCA != "" {
		opts = append(opts, nats.RootCAs(a.TLSCA))
	}
	if a.TLSCert != "" {
		opts = append(opts, nats.ClientCert(a.TLSCert, a.TLSKey))
	}
	return opts
}

func parseBridgeConfig(args []string, env func(string) (string, bool), out io.Writer) (bridgeConfig, error) {
	c := bridgeConfig{NATSURL: "nats://127.0.0.1:4222", NATSPrefix: ingest.DefaultPrefix, LogLevel: "info", LogFormat: "text",
		ZMQLimits: defaultZMQLimits()}
	fs := flag.NewFlagSet("kvrouterd bridge", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Var(&sourceList{&c.ZMQ}, "zmq", "the engine's ZMQ KV events: worker=ID,model=NAME,endpoint=tcp://host:port[,replay=tcp://host:port][,ranks=N][,rank=R][,topic=T]; repeat for several engines")
	fs.StringVar(&c.NATSURL, "nats-url", c.NATSURL, "NATS server or cluster holding the router's stream (comma-separated URLs)")
	c.NATS.flags(fs)
	fs.StringVar(&c.NATSPrefix, "nats-subject-prefix", c.NATSPrefix, "first token of the event subjects, as the routers use it")
	c.ZMQLimits.flags(fs)
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	if err := parseFlags(fs, args, env, out, "kvrouterd bridge: forward an engine's ZMQ KV events into kvrouterd's NATS JetStream stream.\n\n"+
		"Usage: kvrouterd bridge --zmq worker=7,model=llama,endpoint=tcp://127.0.0.1:5557 --nats-url nats://router:4222"); err != nil {
		return c, err
	}
	switch {
	case len(c.ZMQ) == 0:
		return c, fmt.Errorf("--zmq: name at least one engine")
	case c.NATSURL == "":
		return c, fmt.Errorf("--nats-url: empty")
	}
	if err := checkPrefix(c.NATSPrefix); err != nil {
		return c, err
	}
	if err := c.NATS.check(); err != nil {
		return c, err
	}
	if err := c.ZMQLimits.check(); err != nil {
		return c, err
	}
	lc := config{LogLevel: c.LogLevel, LogFormat: c.LogFormat}
	if err := lc.checkLog(); err != nil {
		return c, err
	}
	return c, nil
}

// runBridge forwards until ctx ends.
func runBridge(ctx context.Context, c bridgeConfig, stderr io.Writer) error {
	log := (&config{LogLevel: c.LogLevel, LogFormat: c.LogFormat}).logger(stderr)
	nc, err := nats.Connect(c.NATSURL, append(ingest.ConnectOptions(log), c.NATS.options()...)...)
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
		b, err := ingest.NewBridge(src, pub, c.ZMQLimits.apply(ingest.EngineConfig{Logger: log.With("worker", src.Worker)}))
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
