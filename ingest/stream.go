package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// StreamConfig configures StartStream; a plain value.
type StreamConfig struct {
	// URL is an external NATS server's; empty starts the embedded one of Embedded.
	URL      string
	Embedded EmbeddedConfig
	// Options are added to ConnectOptions' (credentials and TLS for an external server).
	Options  []nats.Option
	Consumer ConsumerConfig
	// Timeout bounds connecting and creating the stream and consumer (0: 30 s).
	Timeout time.Duration
}

// Stream is the event side of a daemon: the embedded NATS server if any, the connection and
// the Consumer feeding a Sink. Its fields are read-only; Close once, from any goroutine.
type Stream struct {
	URL    string             // the server's client URL
	Server *natsserver.Server // the embedded server; nil with an external one
	// Credentials are the embedded server's users; nil with an external server or NoAuth.
	Credentials *Credentials
	Conn        *nats.Conn
	Consumer    *Consumer

	dial []nats.Option // what Dial adds to ConnectOptions: StreamConfig.Options, the embedded user
	log  *slog.Logger  // for the connections Dial opens
}

// ErrUnreachable is StartStream's error when it could connect to none of an external server's
// URLs: none answered, or each refused the client (credentials, TLS), as the wrapped error says.
var ErrUnreachable = errors.New("could not connect to NATS")

// StartStream connects to cfg.URL, or starts the embedded server, and consumes the events into
// sink. On error everything it started is stopped.
func StartStream(ctx context.Context, sink Sink, cfg StreamConfig, log *slog.Logger) (_ *Stream, err error) {
	st := &Stream{URL: cfg.URL, dial: cfg.Options, log: log}
	defer func() {
		if err != nil {
			st.Close()
		}
	}()
	opts := append(ConnectOptions(log), cfg.Options...)
	if cfg.URL == "" {
		e := cfg.Embedded
		if e.Logger == nil {
			e.Logger = log
		}
		if e.Prefix == "" {
			e.Prefix = cfg.Consumer.Prefix
		}
		if e.Stream == "" {
			e.Stream = cfg.Consumer.Stream
		}
		if !e.NoAuth {
			if e.Credentials == nil {
				if e.Credentials, err = EmbeddedCredentials(e.Dir); err != nil {
					return nil, err
				}
			}
			st.Credentials = e.Credentials
			auth := e.Credentials.Router.Option()
			st.dial = append(slices.Clip(st.dial), auth)
			opts = append(opts, auth)
		}
		if st.Server, err = StartEmbedded(e); err != nil {
			return nil, err
		}
		st.URL = st.Server.ClientURL()
		opts = append(opts, nats.InProcessServer(st.Server))
	}
	if cfg.URL != "" {
		// The first connection must succeed, so that a start against a server that is not
		// there fails at once and says so; a connection lost later is retried for ever.
		opts = append(opts, nats.RetryOnFailedConnect(false))
	}
	if st.Conn, err = nats.Connect(st.URL, opts...); err != nil {
		if cfg.URL != "" {
			return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
		}
		return nil, fmt.Errorf("nats %s: %w", st.URL, err)
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cc := cfg.Consumer
	if cc.Logger == nil {
		cc.Logger = log
	}
	if st.Consumer, err = NewConsumer(cctx, st.Conn, sink, cc); err != nil {
		return nil, err
	}
	return st, nil
}

// Health is the consumer's (Consumer.Health): nil while the events are being read.
func (st *Stream) Health() error { return st.Consumer.Health() }

// PublisherURL is URL with the embedded server's publisher user and password in it, the form
// every NATS client accepts; URL itself without credentials.
func (st *Stream) PublisherURL() string {
	if st.Credentials == nil {
		return st.URL
	}
	u, err := url.Parse(st.URL)
	if err != nil {
		return st.URL
	}
	u.User = url.UserPassword(st.Credentials.Publisher.User, st.Credentials.Publisher.Password)
	return u.String()
}

// Dial opens a connection of its own to the stream's server for another part of the daemon,
// with the options that make the stream's connection work there: ConnectOptions (it
// reconnects for ever), StreamConfig.Options (an external server's credentials and TLS),
// kvrouterd's user on the embedded server; then opts, and name as the client name the server
// shows. The caller closes it, before Close (which shuts an embedded server down).
func (st *Stream) Dial(name string, opts ...nats.Option) (*nats.Conn, error) {
	log := st.log
	if log == nil {
		log = slog.Default()
	}
	o := append(ConnectOptions(log), st.dial...)
	o = append(o, opts...)
	o = append(o, nats.Name(name))
	if st.Server != nil {
		o = append(o, nats.InProcessServer(st.Server))
	}
	nc, err := nats.Connect(st.URL, o...)
	if err != nil {
		return nil, fmt.Errorf("nats %s: %w", st.URL, err)
	}
	return nc, nil
}

// Close stops consuming, then closes the connection and the embedded server. Events already
// handed to the sink stay there. A nil Stream is closed already.
func (st *Stream) Close() {
	if st == nil {
		return
	}
	if st.Consumer != nil {
		st.Consumer.Close()
	}
	if st.Conn != nil {
		st.Conn.Close()
	}
	if st.Server != nil {
		st.Server.Shutdown()
		st.Server.WaitForShutdown()
	}
}
