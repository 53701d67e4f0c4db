package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/kvrouterd/kvrouterd/ingest"
)

// zmqLimits bound what an engine's ZMQ connection may make kvrouterd (or the bridge) hold or
// wait for; the daemon and the bridge share them.
type zmqLimits struct {
	MaxMessageBytes int64
	StallTimeout    time.Duration
}

func defaultZMQLimits() zmqLimits {
	return zmqLimits{MaxMessageBytes: ingest.DefaultMaxMessageBytes, StallTimeout: ingest.DefaultStallTimeout}
}

func (z *zmqLimits) flags(fs *flag.FlagSet) {
	fs.Int64Var(&z.MaxMessageBytes, "zmq-max-message-bytes", z.MaxMessageBytes,
		"largest message an engine's ZMQ socket may send (its frames together), and what one subscription holds unhandled; a connection announcing more is dropped before anything is allocated, counted, and dialled again")
	fs.DurationVar(&z.StallTimeout, "zmq-stall-timeout", z.StallTimeout,
		"drop an engine's ZMQ connection that stops this long in the middle of a message or of its handshake, and dial again")
}

func (z *zmqLimits) check() error {
	if z.MaxMessageBytes < 1<<10 || z.MaxMessageBytes > 1<<40 {
		return fmt.Errorf("--zmq-max-message-bytes %d: want 1 KiB to 1 TiB", z.MaxMessageBytes)
	}
	if z.StallTimeout <= 0 {
		return fmt.Errorf("--zmq-stall-timeout %v: want a positive duration", z.StallTimeout)
	}
	return nil
}

// apply returns c with the limits set.
func (z zmqLimits) apply(c ingest.EngineConfig) ingest.EngineConfig {
	c.MaxMessageBytes, c.StallTimeout = z.MaxMessageBytes, z.StallTimeout
	return c
}
