package daemon

import (
	"flag"
	"fmt"
	"time"

	"github.com/kvrouterd/kvrouterd/ingest"
)

// ZMQLimits bound what an engine's ZMQ connection may make kvrouterd (or the bridge) hold or
// wait for; the daemon and the bridge share them.
type ZMQLimits struct {
	MaxMessageBytes int64
	StallTimeout    time.Duration
}

// DefaultZMQLimits are ingest's defaults.
func DefaultZMQLimits() ZMQLimits {
	return ZMQLimits{MaxMessageBytes: ingest.DefaultMaxMessageBytes, StallTimeout: ingest.DefaultStallTimeout}
}

// Flags defines the flags that set z.
func (z *ZMQLimits) Flags(fs *flag.FlagSet) {
	fs.Int64Var(&z.MaxMessageBytes, "zmq-max-message-bytes", z.MaxMessageBytes,
		"largest message an engine's ZMQ socket may send (its frames together), and what one subscription holds unhandled; a connection announcing more is dropped before anything is allocated, counted, and dialled again")
	fs.DurationVar(&z.StallTimeout, "zmq-stall-timeout", z.StallTimeout,
		"drop an engine's ZMQ connection that stops this long in the middle of a message or of its handshake, and dial again")
}

// Check says which flag of z is out of range, or nil.
func (z *ZMQLimits) Check() error {
	if z.MaxMessageBytes < 1<<10 || z.MaxMessageBytes > 1<<40 {
		return fmt.Errorf("--zmq-max-message-bytes %d: want 1 KiB to 1 TiB", z.MaxMessageBytes)
	}
	if z.StallTimeout <= 0 {
		return fmt.Errorf("--zmq-stall-timeout %v: want a positive duration", z.StallTimeout)
	}
	return nil
}

// Apply returns c with the limits set.
func (z ZMQLimits) Apply(c ingest.EngineConfig) ingest.EngineConfig {
	c.MaxMessageBytes, c.StallTimeout = z.MaxMessageBytes, z.StallTimeout
	return c
}
