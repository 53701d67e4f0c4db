// Command kvrload measures kvrouterd's HTTP route throughput and latency, and the same client
// against a no-op fasthttp handler on the same machine, so that the router's own cost can be read
// off as the difference between the two.
//
// Both targets see identical client work: the route request goes through package client (binary
// format, one reused fasthttp HostClient) and is followed on the same goroutine by the complete
// call, so that active load does not pile up; only the route call is timed. The no-op handler
// answers /v1/route with a fixed 130-byte route response that the client decodes like a real one,
// and the complete call with 204, as kvrouterd does.
//
// For --target kvrouterd the index is given realistic content first: every worker holds a shared
// system prefix of blocks/8 blocks; each of --prompts families is a prompt of --blocks blocks that
// starts with that prefix and is held whole by two workers; a worker without a whole family holds
// the first half of one. Each request picks a family at random and replaces a random tail of it,
// so that its cached depth is uniform between 3/4 of the prompt and all of it.
//
// --rate 0 runs a closed loop at saturation: --conns goroutines each send the next request as soon
// as the previous one is answered. --rate R > 0 runs an open loop at R requests per second in total,
// each goroutine on a fixed schedule of R/conns (as wrk2 does); a request that could not be sent at
// its scheduled time because its goroutine was still waiting for an earlier answer is timed from
// the scheduled time, so that queueing is not hidden. Go's timers wake about a millisecond late on
// Linux, so a request whose goroutine was idle is timed from the moment it is actually sent: that
// lateness is the load generator's, not the target's.
//
// Each run prints one line: achieved routes per second, route latency percentiles, errors, this
// process's CPU time per request (client and in-process target), and the share of the machine
// other processes used meanwhile: on a shared machine, a run with a high share measured them too.
// --suite runs the reported matrix and prints it as a markdown table. The command exits with
// status 1 if more than 0.1% of a run's requests fail. Run kvrload --help for the flags.
//
//	go run ./bench/kvrload --suite            # the reported matrix, about 50 s
//	go run ./bench/kvrload --workers 1000     # one run against an in-process kvrouterd
//	go run ./bench/kvrload --addr host:8090   # against a running kvrouterd
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// config is the whole configuration of one invocation: defaults here, then flags.
type config struct {
	Target       string
	Addr         string
	Workers      int
	Blocks       int
	BlockSize    int
	Conns        int
	Duration     time.Duration
	Warmup       time.Duration
	Rate         float64
	Prompts      int
	Seed         uint64
	Timeout      time.Duration
	JSON         bool
	Suite        bool
	SuiteWorkers []int
	// MaxCandidates caps the candidates of each route answer (0: all); SuiteCandidates lists
	// the caps of the --suite matrix.
	MaxCandidates   int
	SuiteCandidates []int
	CPUProfile      string
}

// Under --suite, runs are this long unless --duration or --warmup is given, so that the eight runs
// of the reported matrix finish in well under two minutes.
const (
	suiteDuration = 5 * time.Second
	suiteWarmup   = time.Second
)

func defaults() config {
	return config{
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
		SuiteCandidates: []int{0, 8},
	}
}

// intList is a flag.Value of comma-separated integers ≥ min.
type intList struct {
	p   *[]int
	min int
}

func (l intList) String() string {
	if l.p == nil {
		return ""
	}
	s := make([]string, len(*l.p))
	for i, v := range *l.p {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (l intList) Set(v string) error {
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < l.min {
			return fmt.Errorf("%q is not an integer ≥ %d", f, l.min)
		}
		out = append(out, n)
	}
	*l.p = out
	return nil
}

// parseConfig fills a config from args; --help prints the flags to out and returns flag.ErrHelp.
func parseConfig(args []string, out io.Writer) (config, error) {
	c := defaults()
	fs := flag.NewFlagSet("kvrload", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.Target, "target", c.Target, "what to load: kvrouterd or noop (a fasthttp handler that answers a fixed route response)")
	fs.StringVar(&c.Addr, "addr", c.Addr, "host:port of an external kvrouterd; empty starts the target in-process on a loopback port")
	fs.IntVar(&c.Workers, "workers", c.Workers, "workers registered for model \"bench\"")
	fs.IntVar(&c.Blocks, "blocks", c.Blocks, "blocks per prompt")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "tokens per block")
	fs.IntVar(&c.Conns, "conns", c.Conns, "client connections, each driven by one goroutine")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "measured time per run (5s per run under --suite unless given)")
	fs.DurationVar(&c.Warmup, "warmup", c.Warmup, "unmeasured time before each run (1s under --suite unless given)")
	fs.Float64Var(&c.Rate, "rate", c.Rate, "0: closed loop at saturation; > 0: open loop at this many route requests per second in total")
	fs.IntVar(&c.Prompts, "prompts", c.Prompts, "distinct prompt families")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the prompts and of each goroutine's choices")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "bound on one call; a call that exceeds it counts as an error")
	fs.BoolVar(&c.JSON, "json", c.JSON, "also print each result as one JSON object per line")
	fs.BoolVar(&c.Suite, "suite", c.Suite, "run the reported matrix (per --suite-workers: noop and kvrouterd at saturation, then both at half kvrouterd's saturation) and print a markdown table")
	fs.Var(intList{&c.SuiteWorkers, 1}, "suite-workers", "worker counts of the --suite matrix, comma-separated")
	fs.IntVar(&c.MaxCandidates, "max-candidates", c.MaxCandidates, "candidates per route answer (the request's max_candidates); 0 = every worker")
	fs.Var(intList{&c.SuiteCandidates, 0}, "suite-candidates", "--max-candidates values of the --suite matrix, comma-separated; caps not below the worker count are skipped")
	fs.StringVar(&c.CPUProfile, "cpuprofile", c.CPUProfile, "write a CPU profile of the whole process (client and in-process target) to this file")
	fs.Usage = func() {
		fmt.Fprintf(out, "kvrload: route throughput and latency of kvrouterd next to a no-op fasthttp handler.\n\n"+
			"Usage: kvrload [flags]\n\n")
		fs.VisitAll(func(f *flag.Flag) {
			fmt.Fprintf(out, "  --%s (default %q)\n    \t%s\n", f.Name, f.DefValue, f.Usage)
		})
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.Suite {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["duration"] {
			c.Duration = suiteDuration
		}
		if !set["warmup"] {
			c.Warmup = suiteWarmup
		}
	}
	return c, c.check()
}

func (c *config) check() error {
	switch {
	case c.Target != "kvrouterd" && c.Target != "noop":
		return fmt.Errorf("--target %q: want kvrouterd or noop", c.Target)
	case c.Target == "noop" && c.Addr != "" && !c.Suite:
		return fmt.Errorf("--addr names an external kvrouterd; the noop target always runs in-process")
	case c.Workers < 1 || c.Workers > 1<<20:
		return fmt.Errorf("--workers %d: want 1 to %d", c.Workers, 1<<20)
	case c.Blocks < 8 || c.Blocks > 1<<16:
		return fmt.Errorf("--blocks %d: want 8 to 65536", c.Blocks)
	case c.BlockSize < 1 || c.BlockSize > 1<<16 || c.Blocks*c.BlockSize > 1<<22:
		return fmt.Errorf("--block-size %d: want 1 to 65536, and at most 4M tokens per prompt", c.BlockSize)
	case c.Conns < 1 || c.Conns > 1<<16:
		return fmt.Errorf("--conns %d: want 1 to 65536", c.Conns)
	case c.Duration <= 0 || c.Warmup < 0:
		return fmt.Errorf("--duration %v, --warmup %v: want a positive duration and a non-negative warmup", c.Duration, c.Warmup)
	case !(c.Rate >= 0) || c.Rate > 1e9:
		return fmt.Errorf("--rate %v: want 0 (saturation) or a rate in requests per second", c.Rate)
	case c.Prompts < 1 || c.Prompts > 1<<16:
		return fmt.Errorf("--prompts %d: want 1 to 65536", c.Prompts)
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout %v: want a positive duration", c.Timeout)
	case c.MaxCandidates < 0 || c.MaxCandidates > 1<<16-1:
		return fmt.Errorf("--max-candidates %d: want 0 (all) to 65535", c.MaxCandidates)
	case c.Suite && len(c.SuiteWorkers) == 0:
		return fmt.Errorf("--suite-workers: want at least one worker count")
	case c.Suite && len(c.SuiteCandidates) == 0:
		return fmt.Errorf("--suite-candidates: want at least one value")
	}
	return nil
}

func main() {
	c, err := parseConfig(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvrload:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, c, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvrload:", err)
		os.Exit(1)
	}
}

// run executes one run or the suite, writing results to out and progress to log.
func run(ctx context.Context, c config, out, log io.Writer) error {
	if c.CPUProfile != "" {
		f, err := os.Create(c.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Fprintf(log, "# kvrload %s GOMAXPROCS=%d NumCPU=%d\n", runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU())
	if c.Suite {
		rows, err := runSuite(ctx, c, out, log)
		if len(rows) > 0 {
			fmt.Fprintln(out)
			writeTable(out, rows)
		}
		return err
	}
	res, err := runOne(ctx, c, log)
	if err != nil {
		return err
	}
	printResult(out, &res, c.JSON)
	return res.failed()
}
