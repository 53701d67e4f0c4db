package main

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// The features of large fleets: disaggregated prefill and decode, a host-memory tier, and
// predict-on-route against the delay of KV events, each measured against the fleet without it.
const (
	// hostRatio is the host tier's size against the device KV cache. A DGX H100 has 2 TB of
	// host memory for 8 GPUs, 256 GB per GPU; an 8B model leaves about 60 GB of each GPU's
	// 80 GB to the KV cache: about 4× in host memory.
	hostRatio = 4
	// hostCredit is the router's credit for a host-tier block in the credited row: Dynamo's
	// default --router-host-cache-hit-weight.
	hostCredit = 0.75
	// eventDelay is the delay between a worker's step and the router applying its KV events in
	// the predict rows: the engine's publisher (events leave once per scheduler step), the
	// event bus (a NATS hop) and the router's apply queue under load.
	eventDelay = 50 * time.Millisecond
	// predictedTTL is predict-on-route's TTL in the "on" row: Dynamo's suggested 5 s.
	predictedTTL = 5 * time.Second
)

// prefillShare returns the prefill workers of a disaggregated fleet of fleetWorkers sized as
// the aggregated fleet's work divides (as a planner sizes the pools from load): the fleet's
// prefill share of the step time, rounded, at least 1 and leaving at least 1 decode worker.
func prefillShare(agg *fleet.Result) int {
	total := agg.PrefillBusy + agg.DecodeBusy
	if total <= 0 {
		return fleetWorkers / 2
	}
	p := int(math.Round(float64(fleetWorkers) * float64(agg.PrefillBusy) / float64(total)))
	return min(max(p, 1), fleetWorkers-1)
}

// features measures the three features. conv is the conversation trace's loaded point (nil
// when the trace is missing: the rows on it are then not measured).
func (r *report) features(conv *loadedSet) error {
	if conv == nil {
		r.missing("quality", "the disaggregation and host-tier rows", errors.New("they replay the conversation trace"))
	} else {
		if err := r.disagg(conv); err != nil {
			return err
		}
		if err := r.tiers(conv); err != nil {
			return err
		}
	}
	return r.predict()
}

// kvRun returns set's kv run.
func kvRun(set *loadedSet) qualityRun {
	for _, q := range set.runs {
		if q.mode == scoring.KV && q.peer == "" && q.policy == "" {
			return q
		}
	}
	return qualityRun{}
}

// checked fails a run whose router refused calls or left bookings: its numbers would not be
// those of the fleet the section describes.
func checked(q qualityRun, err error) (qualityRun, error) {
	if err == nil && (q.res.RouteFailures > 0 || q.res.CallErrors > 0 || q.res.Booked != 0) {
		err = fmt.Errorf("%d route failures (%s), %d refused calls, %d requests left booked", q.res.RouteFailures,
			q.res.RouteErr, q.res.CallErrors, q.res.Booked)
	}
	return q, err
}

// disagg compares aggregated serving with disaggregated pools at the same worker count, on
// the conversation trace at its loaded point.
func (r *report) disagg(set *loadedSet) error {
	w := set.w
	agg := kvRun(set)
	s := agg.scale
	itl := func(q qualityRun) dist { return summarize(q.res.ITL(trace.Scale(w.reqs, s))) }
	r.mdf("\n### Disaggregated prefill and decode (%s)\n\n", w.about)
	r.mdf("The same %d simulated workers, aggregated (every worker prefills and decodes) or split into prefill and decode "+
		"pools registered with their roles: a request's prompt runs on a prefill worker chosen by KV cost (generating one "+
		"token, its blocks held there until they have moved), its KV moves to a decode worker chosen by load alone at %s "+
		"(%s KV bytes per token, the bf16 KV of an 8B model like the one the timing model stands for, over one 400 Gb/s "+
		"RDMA NIC, plus %v per transfer; the whole prompt moves), and the decode worker computes the last prompt token and "+
		"decodes. TTFT is the decode worker's first token. *Conditional* is the router's isl_bounding policy with Dynamo's "+
		"thresholds (a prompt with fewer than %d uncached tokens, or less than %.0f %% uncached, is served whole by a decode "+
		"worker). kv routing, arrivals ×%g (the loaded point above). The pools are sized as the aggregated fleet's step "+
		"time divides between prefill and decode (%.0f %% prefill: %d prefill workers), as a planner sizes them; the splits "+
		"beside it are shown for comparison.\n\n",
		fleetWorkers, mdPrinter.Sprintf("%.0f GB/s", fleet.DefaultTransferBandwidth/1e9), mdPrinter.Sprint(sim.KVBytesPerToken),
		fleet.DefaultTransferLatency, router.DefaultEffISLThreshold, 100*router.DefaultEffISLRatioThreshold, s,
		100*float64(agg.res.PrefillBusy)/float64(max(1, agg.res.PrefillBusy+agg.res.DecodeBusy)), prefillShare(agg.res))
	r.mdf("| fleet | TTFT mean / p50 / p99 ms | ITL mean ms | e2e mean s | hit rate | requests split | mean transfer ms |\n")
	r.mdf("|---|---:|---:|---:|---:|---:|---:|\n")
	row := func(name string, q qualityRun) {
		res := q.res
		xfer := 0.0
		if res.Split > 0 {
			xfer = ms(res.TransferTime) / float64(res.Split)
		}
		r.mdf("| %s | %.0f / %.0f / %.0f | %.1f | %.1f | %.1f %% | %d | %.1f |\n", name, ms(q.ttft.mean), ms(q.ttft.p50),
			ms(q.ttft.p99), ms(itl(q).mean), q.e2e.mean.Seconds(), 100*res.HitRate(), res.Split, xfer)
	}
	row(fmt.Sprintf("aggregated, %d workers", fleetWorkers), agg)
	run := func(prefill int, dc *router.DisaggConfig, label string) (qualityRun, error) {
		q, err := checked(r.simulateFleet(w, s, fleet.Config{Mode: scoring.KV, PrefillWorkers: prefill, Disagg: dc}, kvBlocks, label))
		if err != nil {
			err = fmt.Errorf("%s ×%g %s: %w", w.name, s, label, err)
		}
		return q, err
	}
	var best qualityRun
	bestP := prefillShare(agg.res)
	for _, p := range []int{bestP - 1, bestP, bestP + 1} {
		if p < 1 || p >= fleetWorkers {
			continue
		}
		q, err := run(p, nil, fmt.Sprintf("disagg %dP%dD", p, fleetWorkers-p))
		if err != nil {
			return err
		}
		name := fmt.Sprintf("disaggregated, %d prefill + %d decode", p, fleetWorkers-p)
		if p == bestP {
			best, name = q, "**"+name+"**"
		}
		row(name, q)
	}
	cond, err := run(bestP, &router.DisaggConfig{Policy: router.DisaggISLBounding}, fmt.Sprintf("conditional %dP%dD", bestP, fleetWorkers-bestP))
	if err != nil {
		return err
	}
	row(fmt.Sprintf("conditional (isl_bounding), %d prefill + %d decode", bestP, fleetWorkers-bestP), cond)
	// The same fleets at the trace's own speed, far from saturation, for comparison.
	for _, c := range []struct {
		name    string
		prefill int
		dc      *router.DisaggConfig
	}{{fmt.Sprintf("at trace speed ×1: aggregated, %d workers", fleetWorkers), 0, nil},
		{fmt.Sprintf("at trace speed ×1: disaggregated, %d prefill + %d decode", bestP, fleetWorkers-bestP), bestP, nil},
		{fmt.Sprintf("at trace speed ×1: conditional, %d prefill + %d decode", bestP, fleetWorkers-bestP), bestP, &router.DisaggConfig{Policy: router.DisaggISLBounding}}} {
		q, err := checked(r.simulateFleet(w, 1, fleet.Config{Mode: scoring.KV, PrefillWorkers: c.prefill, Disagg: c.dc}, kvBlocks, c.name))
		if err != nil {
			return fmt.Errorf("%s ×1 %s: %w", w.name, c.name, err)
		}
		itl1 := summarize(q.res.ITL(w.reqs))
		xfer := 0.0
		if q.res.Split > 0 {
			xfer = ms(q.res.TransferTime) / float64(q.res.Split)
		}
		r.mdf("| %s | %.0f / %.0f / %.0f | %.1f | %.1f | %.1f %% | %d | %.1f |\n", c.name, ms(q.ttft.mean), ms(q.ttft.p50),
			ms(q.ttft.p99), ms(itl1.mean), q.e2e.mean.Seconds(), 100*q.res.HitRate(), q.res.Split, xfer)
	}
	var curves []curve
	for _, c := range []struct {
		name, about string
		q           qualityRun
	}{
		{"aggregated", fmt.Sprintf("aggregated, %d workers", fleetWorkers), agg},
		{"disaggregated", fmt.Sprintf("disaggregated, %d prefill + %d decode workers, every request split", bestP, fleetWorkers-bestP), best},
		{"conditional", fmt.Sprintf("disaggregated, %d prefill + %d decode workers, isl_bounding (Dynamo's thresholds), %d of %d requests split",
			bestP, fleetWorkers-bestP, cond.res.Split, cond.res.Requests), cond},
	} {
		cd := fmt.Sprintf("%s, %d requests, arrival times ×%g (the loaded point); %d simulated workers × %d blocks of %d tokens, %s; kv, overlap weight 1; KV transfer %s + %v per request; seed %d",
			w.about, len(w.reqs), s, fleetWorkers, kvBlocks, blockSize, c.about, fmt.Sprintf("%d B/token at %.0f GB/s", sim.KVBytesPerToken, fleet.DefaultTransferBandwidth/1e9),
			fleet.DefaultTransferLatency, r.cfg.Seed)
		key := fmt.Sprintf("quality.%s.disagg.%s.", w.name, c.name)
		r.add(key+"ttft_mean", ms(c.q.ttft.mean), "ms", cd)
		r.add(key+"ttft_p99", ms(c.q.ttft.p99), "ms", cd)
		r.add(key+"itl_mean", ms(itl(c.q).mean), "ms", cd)
		curves = append(curves, curve{c.name, c.q.res.TTFT})
	}
	r.mdf("\nDisaggregated against aggregated at this load: mean TTFT %.0f against %.0f ms, mean ITL %.1f against %.1f ms; conditional %.0f ms and %.1f ms.\n",
		ms(best.ttft.mean), ms(agg.ttft.mean), ms(itl(best).mean), ms(itl(agg).mean), ms(cond.ttft.mean), ms(itl(cond).mean))
	return r.cdfPlot(fmt.Sprintf("TTFT CDF, aggregated and disaggregated, %s, kv, arrivals ×%g, %d workers", w.name, s, fleetWorkers),
		"disagg-ttft-cdf-"+w.name+".png", "TTFT CDF, aggregated and disaggregated serving, "+w.name, curves, len(curves))
}

// tiers measures a host-memory tier per worker on the conversation trace at its loaded point:
// none, indexed but not credited by the router, and credited.
func (r *report) tiers(set *loadedSet) error {
	w := set.w
	none := kvRun(set)
	s := none.scale
	inf := trace.InfiniteBound(w.reqs, blockSize)
	hostBlocks := hostRatio * kvBlocks
	reload := sim.HostReloadTime(blockSize, sim.KVBytesPerToken, sim.HostBandwidth)
	r.mdf("\n### Host-memory tier (%s)\n\n", w.about)
	r.mdf("Each worker gets a host tier of %d blocks (%d× its device cache: a DGX H100's 2 TB of host memory is 256 GB per GPU, "+
		"about 4× the KV cache an 8B model leaves on an 80 GB GPU). A block evicted from the device moves there (KVBM's and "+
		"LMCache's offload, published as host-tier events), and a request whose cached prefix continues there reloads those "+
		"blocks at %.0f µs each (%s B per block at 14 GB/s, Dynamo's mocker's host-to-GPU bandwidth) where a recompute costs "+
		"the prefill model's ≈ 1 ms per block. *indexed* applies the host events to the router's index with no credit "+
		"(TierCredit {0, 0}); *credited* credits a host block %g of a device block (Dynamo's default). kv routing, arrivals "+
		"×%g. *Of bound*: device and host hits together against the infinite-cache bound (%.1f %%).\n\n",
		hostBlocks, hostRatio, float64(reload)/1e3, mdPrinter.Sprint(blockSize*sim.KVBytesPerToken), hostCredit, s, 100*inf)
	r.mdf("| host tier | TTFT mean / p99 ms | device hits | host reloads | of bound |\n|---|---:|---:|---:|---:|\n")
	type tierRow struct {
		name, about string
		q           qualityRun
	}
	rows := []tierRow{{"none", "no host tier", none}}
	for _, c := range []struct {
		name, about string
		credit      float64
	}{{"host", "host tier indexed, not credited (TierCredit {0, 0})", 0}, {"host_credit", fmt.Sprintf("host tier credited %g", hostCredit), hostCredit}} {
		fc := fleet.Config{Mode: scoring.KV, TierCredit: &scoring.TierCredit{Host: c.credit}}
		fc.Worker.HostBlocks = hostBlocks
		q, err := checked(r.simulateFleet(w, s, fc, kvBlocks, c.name))
		if err != nil {
			return fmt.Errorf("%s ×%g %s: %w", w.name, s, c.name, err)
		}
		rows = append(rows, tierRow{c.name, c.about, q})
	}
	names := make([]string, len(rows))
	dev, host := make(plotter.Values, len(rows)), make(plotter.Values, len(rows))
	for i, t := range rows {
		res := t.q.res
		of := 100 * (res.HitRate() + res.HostHitRate()) / inf
		r.mdf("| %s | %.0f / %.0f | %.1f %% | %.1f %% | %.0f %% |\n", t.about, ms(t.q.ttft.mean), ms(t.q.ttft.p99),
			100*res.HitRate(), 100*res.HostHitRate(), of)
		cd := fmt.Sprintf("%s, %d requests, arrival times ×%g (the loaded point); %d simulated workers × %d device blocks of %d tokens; %s; host tier %d blocks, reload %v per block; kv, overlap weight 1; seed %d",
			w.about, len(w.reqs), s, fleetWorkers, kvBlocks, blockSize, t.about, hostBlocks, reload, r.cfg.Seed)
		key := fmt.Sprintf("quality.%s.tiers.%s.", w.name, t.name)
		r.add(key+"hit_of_bound", of, "%", cd)
		r.add(key+"ttft_mean", ms(t.q.ttft.mean), "ms", cd)
		names[i] = t.name
		dev[i], host[i] = 100*res.HitRate()/inf, 100*res.HostHitRate()/inf
	}
	credited := rows[len(rows)-1].q.res
	of := 100 * (credited.HitRate() + credited.HostHitRate()) / inf
	r.headline(mdPrinter.Sprintf("%s, loaded, host tier %d× credited %g: device + host hits, of the infinite-cache bound", w.about, hostRatio, hostCredit),
		mdPrinter.Sprintf("%.0f %%", of), target(w, "≥ 80 % of the bound"), r.command("quality"))

	p := plot.New()
	p.Title.Text = fmt.Sprintf("Hits of the infinite-cache bound by host tier, %s, kv, arrivals ×%g", w.name, s)
	p.Y.Label.Text = "% of the infinite-cache bound"
	bd, err := plotter.NewBarChart(dev, vg.Points(40))
	if err != nil {
		return err
	}
	bh, err := plotter.NewBarChart(host, vg.Points(40))
	if err != nil {
		return err
	}
	bd.Color, bh.Color = plotutil.Color(0), plotutil.Color(1)
	bh.StackOn(bd)
	p.Add(bd, bh)
	p.Legend.Add("device hits", bd)
	p.Legend.Add("host reloads", bh)
	p.NominalX(names...)
	l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 80}, {X: float64(len(rows)) - 0.5, Y: 80}})
	if err != nil {
		return err
	}
	l.Color = plotutil.Color(2)
	l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(l)
	p.Legend.Add("target, 80 %", l)
	p.Y.Min, p.Y.Max = 0, 100
	p.Legend.Top = true
	return r.save(p, "tiers-hit-"+w.name+".png", "device hits and host reloads against the infinite-cache bound by host tier, "+w.name)
}

// burstWorkload is the generated burst workload of the predict rows.
func (r *report) burstWorkload() workload {
	b := trace.DefaultBurst()
	if r.cfg.Quick {
		b.Duration = 5 * time.Minute
	}
	return workload{name: "generated", about: fmt.Sprintf("generated burst workload (%v: groups of %d requests over a fresh %d-token prefix, %d more tokens each, arriving within %v)",
		b.Duration, b.Size, b.Prefix, b.Suffix, b.Spread), reqs: trace.Burst(b)}
}

// predict measures predict-on-route on the burst workload, whose siblings arrive before any
// worker has published their prefix, with the events delayed.
func (r *report) predict() error {
	w := r.burstWorkload()
	unloaded, loaded, err := r.loadPoint(w, scoring.RoundRobin, kvBlocks)
	if err != nil {
		return err
	}
	s := loaded.scale
	inf := trace.InfiniteBound(w.reqs, blockSize)
	r.mdf("\n### Predict-on-route (%s)\n\n", w.about)
	r.mdf("The router hears of a worker's blocks %v after the step that stored them ends (the engine's publisher, the event "+
		"bus, the router's apply queue), and a prefix is stored only when the step that computes it ends: the siblings of a "+
		"group all arrive before the router can know where their prefix is. Predict-on-route (TTL %v, Dynamo's suggestion) "+
		"remembers each decision's blocks on its worker. kv routing on %d workers; loaded point ×%g, the lightest at which "+
		"round robin's mean TTFT is ≥ %d× its unloaded value (%.0f → %.0f ms). Infinite-cache bound %.1f %%.\n\n",
		eventDelay, predictedTTL, fleetWorkers, s, loadFactor, ms(unloaded.ttft.mean), ms(loaded.ttft.mean), 100*inf)
	r.mdf("| arrivals × | event delay | predict-on-route | TTFT mean / p99 ms | hit rate | of bound |\n|---:|---:|---|---:|---:|---:|\n")
	var names []string
	var hits plotter.Values
	for _, pt := range []struct {
		scale float64
		delay time.Duration
		rows  bool
	}{{s, eventDelay, true}, {s, 0, false}, {1, eventDelay, false}} {
		for _, on := range []bool{false, true} {
			fc := fleet.Config{Mode: scoring.KV, EventDelay: pt.delay}
			state := "off"
			if on {
				fc.PredictedTTL, state = predictedTTL, "on"
			}
			label := fmt.Sprintf("predict %s, delay %v", state, pt.delay)
			q, err := checked(r.simulateFleet(w, pt.scale, fc, kvBlocks, label))
			if err != nil {
				return fmt.Errorf("%s ×%g %s: %w", w.name, pt.scale, label, err)
			}
			hit := q.res.HitRate()
			r.mdf("| %g | %v | %s | %.0f / %.0f | %.1f %% | %.0f %% |\n", pt.scale, pt.delay, state, ms(q.ttft.mean), ms(q.ttft.p99), 100*hit, 100*hit/inf)
			if !pt.rows {
				continue
			}
			cd := fmt.Sprintf("%s, %d requests, arrival times ×%g (the loaded point); %d simulated workers × %d blocks of %d tokens; kv, overlap weight 1; KV events delayed %v; predict-on-route %s (TTL %v); seed %d",
				w.about, len(w.reqs), pt.scale, fleetWorkers, kvBlocks, blockSize, pt.delay, state, predictedTTL, r.cfg.Seed)
			key := fmt.Sprintf("quality.%s.predict.%s.", w.name, state)
			r.add(key+"hit_rate", 100*hit, "%", cd)
			r.add(key+"ttft_mean", ms(q.ttft.mean), "ms", cd)
			names = append(names, "predict "+state)
			hits = append(hits, 100*hit)
		}
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Prefix hit rate, burst workload, kv, events delayed %v, arrivals ×%g", eventDelay, s)
	p.Y.Label.Text = "prompt tokens served from cache (%)"
	bars, err := plotter.NewBarChart(hits, vg.Points(40))
	if err != nil {
		return err
	}
	bars.Color = plotutil.Color(0)
	p.Add(bars)
	p.NominalX(names...)
	l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 100 * inf}, {X: float64(len(hits)) - 0.5, Y: 100 * inf}})
	if err != nil {
		return err
	}
	l.Color = plotutil.Color(1)
	l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(l)
	p.Legend.Add("infinite-cache bound", l)
	p.Y.Min, p.Y.Max = 0, 100
	p.Legend.Top = true
	return r.save(p, "predict-hit-burst.png", "prefix hit rate with predict-on-route off and on, burst workload")
}

// cdfPlot draws the TTFT CDF of each curve, those from dashed on dashed.
func (r *report) cdfPlot(title, file, caption string, curves []curve, dashed int) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "TTFT (ms, log scale)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	for i, c := range curves {
		l, err := plotter.NewLine(cdf(c.ttft))
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		if i >= dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(c.name, l)
	}
	p.Add(plotter.NewGrid())
	return r.save(p, file, caption)
}
