package e2e

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/router"
)

// Config configures an end-to-end run; a plain value.
type Config struct {
	// Fleet is the simulation; Run sets its Router. Fleet.Pace should be above 0 (see the
	// package doc).
	Fleet fleet.Config
	// Target is a running kvrouterd. A zero Target.Addr starts a Daemon in process for the run
	// instead, configured from Fleet (DaemonRouter).
	Target Target
	// DrainTimeout bounds the wait, after the simulation, for the daemon to apply every event
	// (30 s).
	DrainTimeout time.Duration
	// Logger receives the in-process daemon's logs (nil: discarded).
	Logger *slog.Logger
}

// Result is what an end-to-end run measured; plain data.
type Result struct {
	fleet.Result
	Published PublishStats
	// Drain is the wall time from the simulation's end until the daemon had applied every
	// event published.
	Drain time.Duration
}

// Run replays reqs on cfg.Fleet's simulated workers routed by a kvrouterd over HTTP and NATS,
// waits until the daemon has applied every event, and unregisters the workers.
func Run(cfg Config, reqs []trace.Request) (res *Result, err error) {
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	t := cfg.Target
	if t.Addr == "" {
		d, err := StartDaemon(DaemonConfig{Router: DaemonRouter(cfg.Fleet), Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		defer func() { err = errors.Join(err, d.Close()) }()
		t = d.Target()
	}
	rem, err := Dial(t)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, rem.Close()) }()
	fc := cfg.Fleet
	fc.Router = rem
	fr, err := fleet.Run(fc, reqs)
	if err != nil {
		return nil, err
	}
	end := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	err = rem.Drain(ctx)
	return &Result{Result: *fr, Published: rem.Stats(), Drain: time.Since(end)}, err
}

// DaemonRouter is the router configuration of an in-process daemon for simulation fc: the
// simulation's routing settings and block size, cmd/kvrouterd's defaults otherwise.
func DaemonRouter(fc fleet.Config) router.Config {
	bs := fc.Worker.BlockSize
	if bs == 0 {
		bs = sim.DefaultWorkerConfig().BlockSize
	}
	return router.Config{
		BlockSize:      bs,
		Mode:           fc.Mode,
		OverlapWeight:  fc.OverlapWeight,
		Temperature:    fc.Temperature,
		NoTrackPrefill: fc.NoPrefill,
		RequestExpiry:  300 * time.Second,
		Shards:         runtime.NumCPU(),
		QueueLen:       256,
		WorkerTimeout:  30 * time.Second,
		ClearOnGap:     true,
	}
}
