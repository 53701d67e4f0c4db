package main

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/replay"
	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/scoring"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// indexWorkers are the fleet sizes the index is measured at.
var indexWorkers = []int{8, 1000, 10000}

// index records the conversation trace's KV events, and each --trace's, on 8 simulated workers
// and replays them into the index at each fleet size (package bench/replay).
func (r *report) index() error {
	r.mdf("\n## Index\n\n")
	path := filepath.Join(r.cfg.Traces, "mooncake", "conversation_trace.jsonl")
	reqs, err := trace.LoadMooncake(path, trace.MooncakeOptions{})
	if err != nil {
		r.mdf("*Not measured: %v.*\n", err)
		r.logf("index: %v (skipped)", err)
		r.missing("index", "the index on the conversation trace's events", err)
	} else if err := r.indexTrace("", "Mooncake conversation trace", reqs, false); err != nil {
		return err
	}
	for _, t := range r.cfg.Extra {
		w, err := r.extra(t)
		if err != nil {
			return err
		}
		r.mdf("\n### Index: %s\n\n", t.Name)
		if err := r.indexTrace(t.Name, w.about, w.reqs, w.closedLoop); err != nil {
			return fmt.Errorf("--trace %s: %w", t.Name, err)
		}
	}
	return nil
}

// indexTrace is the index section for one trace, its rows named index.NAME.wN.… (name empty:
// the conversation trace's, index.wN.…, with the headlines and the size plot).
func (r *report) indexTrace(name, about string, reqs []trace.Request, closed bool) error {
	prefix := "index."
	if name != "" {
		prefix += name + "."
	}
	wc := sim.DefaultWorkerConfig()
	wc.BlockSize, wc.Blocks = blockSize, kvBlocks
	t0 := time.Now()
	fc := fleet.Config{Workers: fleetWorkers, Mode: scoring.KV, Worker: wc, Seed: r.cfg.Seed, ClosedLoop: closed}
	kvDefault(&fc)
	s, err := replay.Record(reqs, fc)
	if err != nil {
		return err
	}
	ss := s.Stats()
	r.logf("index: recorded %d batches, %d stored and %d removed blocks in %v", ss.Batches, ss.Stored, ss.Removed,
		time.Since(t0).Round(10*time.Millisecond))
	r.mdf("The KV events the %d simulated workers published while serving the whole %s (kv routing, "+
		"%d blocks of %d tokens per worker: %d batches, %d blocks stored, %d removed) are replayed into the index through the "+
		"shards, as the daemon applies them, by N/8 groups of workers each replaying the same stream (package `bench/replay`; "+
		"the groups start at staggered points so consecutive writes touch different blocks). Work is capped at 10^7 stored "+
		"blocks, so large fleets replay a prefix of the stream (*prefix*). *Apply* is blocks stored and removed per second until "+
		"every queue is drained; *match under writes* is Index.Match of the trace's own prompts while a writer churns blocks "+
		"at the fleet's own event rate × the groups; bytes are heap per (block, worker) residency.\n\n",
		fleetWorkers, about, kvBlocks, blockSize, ss.Batches, ss.Stored, ss.Removed)
	r.mdf("| workers | prefix | residencies | distinct blocks | apply, M blocks/s | bytes per residency | holders of a query's first block | match under writes p50 / p99 / p99.9 µs | writer, blocks/s |\n")
	r.mdf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var results []*replay.Result
	for _, n := range indexWorkers {
		cfg := replay.Config{Workers: n, Seed: r.cfg.Seed, Progress: progressWriter{r, "index: "}}
		if r.cfg.Quick {
			cfg = replay.Quick(cfg)
		}
		res, err := replay.Run(s, cfg)
		if err != nil {
			return fmt.Errorf("%d workers: %w", n, err)
		}
		results = append(results, res)
		r.mdf("| %d | %.1f %% | %d | %d | %.2f | %.1f | %.0f | %.1f / %.1f / %.1f | %.0f |\n", n, 100*res.Prefix, res.Residencies,
			res.Entries, res.ApplyRate/1e6, res.BytesPerResidency, res.Holders, us(res.P50), us(res.P99), us(res.P999), res.WriteRate)
		cond := fmt.Sprintf("%s's KV events (8 simulated workers, %d blocks of %d tokens) replayed by %d groups to %d workers, %.1f %% of the stream; %d residencies; %d shards; %s",
			about, kvBlocks, blockSize, res.Groups, n, 100*res.Prefix, res.Residencies, res.Shards, machine())
		key := fmt.Sprintf("%sw%d.", prefix, n)
		r.add(key+"apply_rate", res.ApplyRate, "blocks/s", cond)
		r.add(key+"bytes_per_residency", res.BytesPerResidency, "B", cond)
		r.add(key+"match_p50", us(res.P50), "µs", cond+fmt.Sprintf("; writer %.0f blocks/s", res.WriteRate))
		r.add(key+"match_p99", us(res.P99), "µs", cond+fmt.Sprintf("; writer %.0f blocks/s", res.WriteRate))
		r.add(key+"match_p999", us(res.P999), "µs", cond+fmt.Sprintf("; writer %.0f blocks/s", res.WriteRate))
		r.add(key+"residencies", float64(res.Residencies), "residencies", cond)
	}
	if name != "" {
		return nil
	}
	last := results[len(results)-1]
	r.headline(mdPrinter.Sprintf("index on the conversation trace's events at %d workers: match p99 under writes (%.0f blocks/s)", last.Workers, last.WriteRate),
		mdPrinter.Sprintf("%.0f µs", us(last.P99)), "≤ 100 µs", r.command("index"))
	r.headline("index: apply rate, drained, 8 / 1,000 / 10,000 workers; bytes per residency",
		mdPrinter.Sprintf("%.1f / %.1f / %.1f M blocks/s; %.0f / %.0f / %.0f B", results[0].ApplyRate/1e6, results[1].ApplyRate/1e6,
			last.ApplyRate/1e6, results[0].BytesPerResidency, results[1].BytesPerResidency, last.BytesPerResidency), "—", r.command("index"))
	return r.sizePlot(results)
}

// sizePlot draws match latency (no writes) against index size, per fleet size.
func (r *report) sizePlot(results []*replay.Result) error {
	p := plot.New()
	p.Title.Text = "Match latency vs index size (conversation trace's events, no concurrent writes)"
	p.X.Label.Text = "residencies ((block, worker) pairs, log scale)"
	p.Y.Label.Text = "match latency (µs, log scale)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	for i, res := range results {
		for j, q := range []string{"p50", "p99"} {
			xy := make(plotter.XYs, 0, len(res.Sizes))
			for _, sp := range res.Sizes {
				v := sp.P50
				if j == 1 {
					v = sp.P99
				}
				if sp.Residencies > 0 && v > 0 {
					xy = append(xy, plotter.XY{X: float64(sp.Residencies), Y: us(v)})
				}
			}
			if len(xy) == 0 {
				continue
			}
			l, pts, err := plotter.NewLinePoints(xy)
			if err != nil {
				return err
			}
			l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
			if j == 1 {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			}
			p.Add(l, pts)
			p.Legend.Add(fmt.Sprintf("%d workers, %s", res.Workers, q), l)
		}
	}
	p.Add(plotter.NewGrid())
	return r.save(p, "match-vs-size.png", "match latency against index size")
}

// progressWriter prefixes a package's progress lines with the report's clock.
type progressWriter struct {
	r      *report
	prefix string
}

func (w progressWriter) Write(b []byte) (int, error) {
	for _, l := range splitLines(string(b)) {
		w.r.logf("%s%s", w.prefix, l)
	}
	return len(b), nil
}
