// Command kvrload measures kvrouterd's HTTP route throughput and latency next to a no-op fasthttp
// handler on the same machine: the command line of package bench/loadgen, whose documentation
// gives the method (closed loop at saturation, open loop at a fixed rate, the index content and
// how queueing is timed). The flags fill a loadgen.Config; --target, --rate and the others
// correspond to its fields.
//
// Each run prints one line: achieved routes per second, route latency percentiles, errors, this
// process's CPU time per request (client and in-process target), and the share of the machine
// other processes used meanwhile (on a shared machine, a run with a high share measured them
// too); --json adds the result as one JSON object per line. --suite runs the reported matrix
// (loadgen.RunSuite), printing each run's line as it comes and then a markdown table; its runs
// are loadgen.SuiteDuration long unless --duration or --warmup is given. --added measures the
// latency kvrouterd adds over the no-op handler (loadgen.RunAdded), its index padded to
// --residencies and fed --event-rate blocks per second of events (loadgen.AddedResidencies and
// AddedEventRate unless given), printing each run's line and then a markdown table of medians
// over the runs with their ranges. Progress goes to standard error. The command exits with
// status 2 for bad flags, and 1 if a run could not be done or more than 0.1% of a run's requests
// failed. Run kvrload --help for the flags.
//
//	go run ./bench/kvrload --suite            # the reported matrix, about three and a half minutes
//	go run ./bench/kvrload --added            # the added latency, about five minutes (make load-1cpu)
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

	"github.com/kvrouterd/kvrouterd/bench/loadgen"
)

// config is the whole configuration of one invocation: loadgen's defaults, then flags.
type config struct {
	loadgen.Config
	JSON       bool
	Suite      bool
	Added      bool
	CPUProfile string
	LatencyLog string
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
	c := config{Config: loadgen.Defaults()}
	fs := flag.NewFlagSet("kvrload", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.Target, "target", c.Target, "what to load: kvrouterd or noop (a fasthttp handler that answers a fixed route response)")
	fs.StringVar(&c.Addr, "addr", c.Addr, "host:port of an external kvrouterd; empty starts the target in-process on a loopback port")
	fs.IntVar(&c.Workers, "workers", c.Workers, "workers registered for model \"bench\"")
	fs.IntVar(&c.Blocks, "blocks", c.Blocks, "blocks per prompt")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "tokens per block")
	fs.IntVar(&c.Conns, "conns", c.Conns, "client connections, each driven by one goroutine")
	fs.DurationVar(&c.Duration, "duration", c.Duration, fmt.Sprintf("measured time per run (%v per run under --suite unless given)", loadgen.SuiteDuration))
	fs.IntVar(&c.WarmupCalls, "warmup-calls", c.WarmupCalls, "a closed loop's requests before its warmup, unmeasured (the suite sends SuiteWarmupCalls)")
	fs.DurationVar(&c.Warmup, "warmup", c.Warmup, fmt.Sprintf("unmeasured time before each run (%v under --suite unless given)", loadgen.SuiteWarmup))
	fs.Float64Var(&c.Rate, "rate", c.Rate, "0: closed loop at saturation; > 0: open loop at this many route requests per second in total")
	fs.IntVar(&c.Prompts, "prompts", c.Prompts, "distinct prompt families")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the prompts and of each goroutine's choices")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "bound on one call; a call that exceeds it counts as an error")
	fs.BoolVar(&c.JSON, "json", c.JSON, "also print each result as one JSON object per line")
	fs.BoolVar(&c.Suite, "suite", c.Suite, "run the reported matrix (per --suite-workers: noop and kvrouterd at saturation, then both at half kvrouterd's saturation) and print a markdown table")
	fs.Var(intList{&c.SuiteWorkers, 1}, "suite-workers", "worker counts of the --suite matrix, comma-separated")
	fs.IntVar(&c.MaxCandidates, "max-candidates", c.MaxCandidates, "candidates per route answer (the request's max_candidates); 0 = every worker")
	fs.IntVar(&c.NoopCandidates, "noop-candidates", c.NoopCandidates, "candidates in the noop target's route answer; 0 = its usual two (--suite also runs it with as many as kvrouterd answers)")
	fs.Var(intList{&c.SuiteCandidates, 0}, "suite-candidates", "--max-candidates values of the --suite matrix, comma-separated; caps not below the worker count are skipped")
	fs.IntVar(&c.Residencies, "residencies", c.Residencies, fmt.Sprintf("pad the in-process kvrouterd's index with filler prompts to this many (block, worker) pairs; 0: none (%d under --added unless given)", loadgen.AddedResidencies))
	fs.Float64Var(&c.EventRate, "event-rate", c.EventRate, fmt.Sprintf("KV events applied to the in-process kvrouterd while it is loaded, in blocks per second, removed and stored alike; 0: none (%.0f under --added unless given)", loadgen.AddedEventRate))
	fs.BoolVar(&c.Added, "added", c.Added, "measure the latency kvrouterd adds over the noop target (per --added-workers: the noop's saturation, then --added-runs pairs of runs at each --added-percents of it) and print a markdown table")
	fs.Var(intList{&c.AddedWorkers, 1}, "added-workers", "worker counts of --added, comma-separated")
	fs.Var(intList{&c.AddedPercents, 1}, "added-percents", "offered rates of --added in percent of the noop target's saturated rate, comma-separated")
	fs.IntVar(&c.AddedRuns, "added-runs", c.AddedRuns, "pairs of runs of each --added case, whose medians are reported")
	fs.IntVar(&c.AddedCandidates, "added-candidates", c.AddedCandidates, "candidates in every answer under --added, kvrouterd's and the noop's; 0 = every worker")
	fs.StringVar(&c.CPUProfile, "cpuprofile", c.CPUProfile, "write a CPU profile of the whole process (client and in-process target) to this file")
	fs.StringVar(&c.LatencyLog, "latency-log", c.LatencyLog, "write each measured route to this file as a line: µs from the measured window's start to when it was timed from, its latency in µs, its connection (not with --suite)")
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
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.Suite || c.Added {
		if !set["duration"] {
			c.Duration = loadgen.SuiteDuration
		}
		if !set["warmup"] {
			c.Warmup = loadgen.SuiteWarmup
		}
	}
	if c.Added {
		if !set["residencies"] {
			c.Residencies = loadgen.AddedResidencies
		}
		if !set["event-rate"] {
			c.EventRate = loadgen.AddedEventRate
		}
	}
	switch {
	case c.Suite && c.Added:
		return c, errors.New("--suite and --added are two measurements: give one")
	case (c.Suite || c.Added) && c.LatencyLog != "":
		return c, errors.New("--latency-log is for one run, not with --suite or --added")
	}
	return c, c.check()
}

// check refuses what loadgen would, naming the flags. The suite sets --target per run and uses
// --addr for its kvrouterd runs only, so --addr goes with --target noop there.
func (c *config) check() error {
	lc := c.Config
	if (c.Suite || c.Added) && lc.Target == "noop" {
		lc.Addr = ""
	}
	name := func(field string) string { return "--" + flagOf[field] }
	if c.Added {
		// Its runs are of both targets, kvrouterd's with the index and the stream.
		lc.Target = "kvrouterd"
		if err := lc.CheckAdded(name); err != nil {
			return err
		}
	}
	return lc.Check(name)
}

// flagOf is the flag of each loadgen.Config field that loadgen.Config.Check names.
var flagOf = map[string]string{
	"Target": "target", "Addr": "addr", "Workers": "workers", "Blocks": "blocks", "BlockSize": "block-size",
	"Conns": "conns", "Duration": "duration", "Warmup": "warmup", "WarmupCalls": "warmup-calls", "Rate": "rate", "Prompts": "prompts",
	"Timeout": "timeout", "MaxCandidates": "max-candidates", "NoopCandidates": "noop-candidates",
	"Residencies": "residencies", "EventRate": "event-rate", "AddedWorkers": "added-workers",
	"AddedPercents": "added-percents", "AddedRuns": "added-runs", "AddedCandidates": "added-candidates",
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
	if c.Added {
		rows, err := loadgen.RunAdded(ctx, c.Config, func(r loadgen.Result) { printResult(out, &r, c.JSON) }, log)
		if len(rows) > 0 {
			fmt.Fprintln(out)
			writeAdded(out, rows, &c.Config)
		}
		return err
	}
	if c.Suite {
		rows, err := loadgen.RunSuite(ctx, c.Config, func(r loadgen.Result) { printResult(out, &r, c.JSON) }, log)
		if len(rows) > 0 {
			fmt.Fprintln(out)
			writeTable(out, rows)
		}
		return err
	}
	var f *os.File
	if c.LatencyLog != "" {
		var err error
		if f, err = os.Create(c.LatencyLog); err != nil {
			return err
		}
		defer f.Close()
		c.Config.LatencyLog = f
	}
	res, err := loadgen.Run(ctx, c.Config, log)
	if err != nil {
		return err
	}
	if f != nil {
		if err := f.Close(); err != nil {
			return err
		}
	}
	printResult(out, &res, c.JSON)
	return res.Err()
}
