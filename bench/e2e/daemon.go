package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/server"
	"github.com/prometheus/client_golang/prometheus"
)

// DaemonConfig configures a Daemon; a plain value. Zero fields take the defaults listed.
type DaemonConfig struct {
	// Router is the router's configuration (Logger: this Config's Logger).
	Router router.Config
	// Dir holds JetStream's files; empty: a new temporary directory that Close removes.
	Dir    string
	Prefix string // subject prefix (ingest.DefaultPrefix)
	Stream string // stream name (ingest.DefaultStream)
	// Logger receives the daemon's logs (nil: discarded).
	Logger *slog.Logger
}

// Daemon, safe for concurrent use (Close once), is kvrouterd assembled in this process as
// cmd/kvrouterd assembles it with its default event transport: a router, its HTTP server on a
// loopback port, an embedded NATS server with JetStream on another, and the stream consumer
// feeding the router.
type Daemon struct {
	Router   *router.Router
	Consumer *ingest.Consumer
	Addr     string // HTTP, host:port
	NATSURL  string

	srv    *server.Server
	served chan error
	events *ingest.Stream
	tmp    string // Dir, when StartDaemon made it
	prefix string
	stream string
}

// StartDaemon starts a Daemon.
func StartDaemon(cfg DaemonConfig) (_ *Daemon, err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Prefix == "" {
		cfg.Prefix = ingest.DefaultPrefix
	}
	if cfg.Stream == "" {
		cfg.Stream = ingest.DefaultStream
	}
	d := &Daemon{prefix: cfg.Prefix, stream: cfg.Stream}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if cfg.Dir == "" {
		if d.tmp, err = os.MkdirTemp("", "kvrouterd-e2e-"); err != nil {
			return nil, err
		}
		cfg.Dir = d.tmp
	}
	rc := cfg.Router
	rc.Logger = log
	d.Router = router.New(rc)
	d.events, err = ingest.StartStream(context.Background(), d.Router, ingest.StreamConfig{
		Embedded: ingest.EmbeddedConfig{Dir: filepath.Join(cfg.Dir, "nats"), Listen: "127.0.0.1:0"},
		Consumer: ingest.ConsumerConfig{Prefix: cfg.Prefix, Stream: cfg.Stream},
	}, log)
	if err != nil {
		return nil, fmt.Errorf("e2e: %w", err)
	}
	// Remotes publish as the embedded server's publisher user, as a fleet's workers would.
	d.NATSURL, d.Consumer = d.events.PublisherURL(), d.events.Consumer
	reg := prometheus.NewRegistry()
	reg.MustRegister(d.Consumer.Collector())
	d.srv = server.New(d.Router, server.Config{Logger: log, Registry: reg})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d.Addr = ln.Addr().String()
	d.served = make(chan error, 1)
	go func() { d.served <- d.srv.Serve(ln) }()
	return d, nil
}

// Target is where a Remote finds the Daemon.
func (d *Daemon) Target() Target {
	return Target{Addr: d.Addr, NATSURL: d.NATSURL, Prefix: d.prefix, Stream: d.stream}
}

// Close stops the Daemon in cmd/kvrouterd's order: no more requests, no more events, then the
// router applies the events it accepted.
func (d *Daemon) Close() error {
	var errs []error
	if d.served != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, d.srv.Shutdown(ctx))
		cancel()
		errs = append(errs, <-d.served)
		d.served = nil
	}
	d.events.Close()
	d.events, d.Consumer = nil, nil
	if d.Router != nil {
		d.Router.Close()
		d.Router = nil
	}
	if d.tmp != "" {
		errs = append(errs, os.RemoveAll(d.tmp))
		d.tmp = ""
	}
	return errors.Join(errs...)
}
