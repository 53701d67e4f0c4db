package loadgen

import (
	"errors"
	"fmt"
	"io"
	"time"
)

// ErrConfig is wrapped by the error Run and RunSuite return for a Config they refuse.
var ErrConfig = errors.New("loadgen: invalid configuration")

// Config configures one run, or with the suite lists the suite; a plain value. Defaults gives
// every field a usable value.
type Config struct {
	// Target is what to load: "kvrouterd", or "noop", a fasthttp handler that answers a fixed
	// route response. RunSuite sets it per run.
	Target string
	// Addr is the host:port of an external kvrouterd; empty starts the target in-process on a
	// loopback port. The no-op target always runs in-process: Run refuses an Addr with it, and
	// RunSuite uses Addr for its kvrouterd runs only.
	Addr      string
	Workers   int           // workers registered for model "bench"; RunSuite sets it per run
	Blocks    int           // blocks per prompt
	BlockSize int           // tokens per block
	Conns     int           // client connections, each driven by one goroutine
	Duration  time.Duration // measured time of each run
	Warmup    time.Duration // unmeasured time before each run
	// Rate is 0 for a closed loop at saturation, or the route requests per second in total of an
	// open loop. RunSuite sets it per run.
	Rate    float64
	Prompts int           // distinct prompt families
	Seed    uint64        // seed of the prompts and of each goroutine's choices
	Timeout time.Duration // bound on one call; a call that exceeds it counts as an error
	// MaxCandidates caps the candidates of each route answer (the request's max_candidates; 0:
	// every worker). RunSuite sets it per run.
	MaxCandidates int
	// NoopCandidates is the number of candidates in the no-op target's route answer: 0 for its
	// usual fixed answer of two, or as many as kvrouterd's answer carries, so that the two targets
	// move answers of the same size. RunSuite sets it per run.
	NoopCandidates int
	// SuiteWorkers and SuiteCandidates are the worker counts and candidate caps of RunSuite's
	// matrix; Run ignores them.
	SuiteWorkers    []int
	SuiteCandidates []int
	// SuiteWarmupCalls is the fewest requests a run of RunSuite sends before it measures (an
	// open loop's warmup lengthened to match, a closed loop's WarmupCalls). fasthttp's body
	// buffers come from process-wide pools that size themselves to the last 42,000 bodies
	// released: a run of 40 KB answers after one of 130-byte answers had every large buffer
	// dropped and allocated one per request (a collection every 25 ms, millisecond tails) until
	// they recalibrated.
	SuiteWarmupCalls int
	// WarmupCalls, in a closed loop (Rate 0), is how many requests the run sends before its
	// Warmup begins, unmeasured as the warmup is (failures count as warmup errors); 0 sends none.
	// RunSuite sets it to SuiteWarmupCalls for its saturated runs, whose answers' size often
	// differs from the run before's.
	WarmupCalls int
	// Residencies pads a kvrouterd target's index with filler prompts (filler.go) until it holds
	// at least this many (block, worker) pairs; 0 adds none. The target must run in-process.
	Residencies int
	// EventRate is the KV events applied to a kvrouterd target while it is loaded, in blocks per
	// second (removed and stored counted alike), through router.Ingest as the daemon applies a
	// worker's event stream; 0 streams none. The events churn the filler prompts' tails, so the
	// index keeps its size. The target must run in-process.
	EventRate float64
	// AddedWorkers, AddedPercents, AddedRuns and AddedCandidates are RunAdded's matrix: the
	// worker counts; the offered rates, in percent of the no-op target's saturated rate; the
	// runs of each case; and the candidates of each answer (kvrouterd's max_candidates, and as
	// many in the no-op's). Run and RunSuite ignore them.
	AddedWorkers    []int
	AddedPercents   []int
	AddedRuns       int
	AddedCandidates int
	// LatencyLog, if not nil, gets one line per measured successful route of a run, in the order
	// they were timed from: microseconds from the measured window's start to the moment its
	// latency is timed from (for a request scheduled near the window's end and sent late, that
	// can be after the window), the latency in microseconds, and the connection, separated by
	// spaces. It shows whether slow requests are spread out or come in episodes in which the
	// whole machine stalled. RunSuite ignores it.
	LatencyLog io.Writer
}

// SuiteDuration and SuiteWarmup are the run lengths of the reported suite, shorter than
// Defaults' so that the twenty runs of Defaults' matrix take about three and a half minutes
// (every run sends SuiteWarmupCalls requests first: an open loop's warmup is lengthened to
// match, a closed loop adds a prelude of one to two seconds). A quicker suite (say 1 s runs
// after 300 ms) fills the same rows from fewer samples, so its tails are noisier.
const (
	SuiteDuration = 5 * time.Second
	SuiteWarmup   = time.Second
)

// AddedResidencies and AddedEventRate are the index size and the event stream of the reported
// added-latency table (issue 26): a gateway's router holds about a million residencies and takes
// a fleet's events while it routes. Defaults leaves both off, as the other measurements do not
// include them; kvrload --added sets them unless given.
const (
	AddedResidencies = 1_000_000
	AddedEventRate   = 1e6
)

// Defaults is the configuration of a single run against an in-process kvrouterd with 8 workers,
// and of the reported suite's matrix (whose runs are SuiteDuration long after SuiteWarmup).
func Defaults() Config {
	return Config{
		Target:       "kvrouterd",
		Workers:      8,
		Blocks:       128,
		BlockSize:    16,
		Conns:        32,
		Duration:     10 * time.Second,
		Warmup:       2 * time.Second,
		Prompts:      64,
		Seed:         1,
		Timeout:      time.Second,
		SuiteWorkers: []int{8, 1000},
		// Every worker, and the few a gateway needs besides the choice (fallbacks).
		SuiteCandidates:  []int{0, 8},
		SuiteWarmupCalls: 45000,
		AddedWorkers:     []int{8, 1000},
		AddedPercents:    []int{10, 50},
		AddedRuns:        5,
		// The choice and a few fallbacks, what a gateway asks for.
		AddedCandidates: 8,
	}
}

// Check reports the first setting of c that Run refuses. Its message names a field by
// name(field), field being the Go name ("Workers"), so that a command can speak of its flags
// instead; a nil name leaves the Go name.
func (c *Config) Check(name func(field string) string) error {
	if name == nil {
		name = func(f string) string { return f }
	}
	switch {
	case c.Target != "kvrouterd" && c.Target != "noop":
		return fmt.Errorf("%s %q: want kvrouterd or noop", name("Target"), c.Target)
	case c.Target == "noop" && c.Addr != "":
		return fmt.Errorf("%s names an external kvrouterd; the noop target always runs in-process", name("Addr"))
	case c.Workers < 1 || c.Workers > 1<<20:
		return fmt.Errorf("%s %d: want 1 to %d", name("Workers"), c.Workers, 1<<20)
	case c.Blocks < 8 || c.Blocks > 1<<16:
		return fmt.Errorf("%s %d: want 8 to 65536", name("Blocks"), c.Blocks)
	case c.BlockSize < 1 || c.BlockSize > 1<<16 || c.Blocks*c.BlockSize > 1<<22:
		return fmt.Errorf("%s %d: want 1 to 65536, and at most 4M tokens per prompt", name("BlockSize"), c.BlockSize)
	case c.Conns < 1 || c.Conns > 1<<16:
		return fmt.Errorf("%s %d: want 1 to 65536", name("Conns"), c.Conns)
	case c.Duration <= 0 || c.Warmup < 0:
		return fmt.Errorf("%s %v, %s %v: want a positive duration and a non-negative warmup", name("Duration"), c.Duration, name("Warmup"), c.Warmup)
	case c.WarmupCalls < 0:
		return fmt.Errorf("%s %d: want 0 or more", name("WarmupCalls"), c.WarmupCalls)
	case !(c.Rate >= 0) || c.Rate > 1e9:
		return fmt.Errorf("%s %v: want 0 (saturation) or a rate in requests per second", name("Rate"), c.Rate)
	case c.Prompts < 1 || c.Prompts > 1<<16:
		return fmt.Errorf("%s %d: want 1 to 65536", name("Prompts"), c.Prompts)
	case c.Timeout <= 0:
		return fmt.Errorf("%s %v: want a positive duration", name("Timeout"), c.Timeout)
	case c.MaxCandidates < 0 || c.MaxCandidates > 1<<16-1:
		return fmt.Errorf("%s %d: want 0 (all) to 65535", name("MaxCandidates"), c.MaxCandidates)
	case c.NoopCandidates < 0 || c.NoopCandidates > 1<<16-1:
		return fmt.Errorf("%s %d: want 0 (two) to 65535", name("NoopCandidates"), c.NoopCandidates)
	case c.Residencies < 0 || c.Residencies > 1<<30:
		return fmt.Errorf("%s %d: want 0 to %d", name("Residencies"), c.Residencies, 1<<30)
	case !(c.EventRate >= 0) || c.EventRate > 1e9:
		return fmt.Errorf("%s %v: want 0 (none) or blocks per second", name("EventRate"), c.EventRate)
	case (c.Residencies > 0 || c.EventRate > 0) && c.Target == "kvrouterd" && c.Addr != "":
		return fmt.Errorf("%s names an external kvrouterd; %s and %s need one in-process", name("Addr"), name("Residencies"), name("EventRate"))
	}
	return nil
}

// suiteRun is the configuration of one run of the suite: cands is the kvrouterd answer's cap, or
// the no-op answer's candidates.
func (c *Config) suiteRun(target string, workers, cands int, rate float64) Config {
	rc := *c
	rc.Target, rc.Workers, rc.MaxCandidates, rc.NoopCandidates, rc.Rate = target, workers, cands, 0, rate
	rc.LatencyLog = nil
	if target == "noop" {
		rc.Addr, rc.MaxCandidates, rc.NoopCandidates = "", 0, cands
	}
	if rate > 0 {
		rc.Warmup = max(rc.Warmup, time.Duration(float64(c.SuiteWarmupCalls)/rate*float64(time.Second)))
	} else {
		rc.WarmupCalls = max(rc.WarmupCalls, c.SuiteWarmupCalls)
	}
	return rc
}

// checkSuite reports the first setting of c that RunSuite refuses: no worker counts or caps, or
// a run of the matrix that Run would refuse. The open-loop runs are checked at a nominal rate,
// as theirs is known only once the saturated run is done.
func (c *Config) checkSuite() error {
	if len(c.SuiteWorkers) == 0 {
		return errors.New("SuiteWorkers: want at least one worker count")
	}
	if len(c.SuiteCandidates) == 0 {
		return errors.New("SuiteCandidates: want at least one value")
	}
	if c.SuiteWarmupCalls < 0 {
		return fmt.Errorf("SuiteWarmupCalls %d: want ≥ 0", c.SuiteWarmupCalls)
	}
	// The no-op runs differ from kvrouterd's only in settings Check accepts either way.
	for _, n := range c.SuiteWorkers {
		for _, k := range c.SuiteCandidates {
			rc := c.suiteRun("kvrouterd", n, k, 1)
			if err := rc.Check(nil); err != nil {
				return fmt.Errorf("suite run with %d workers, %d candidates: %w", n, k, err)
			}
		}
	}
	return nil
}
