package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// save writes p as a PNG into the output directory and links it from the markdown.
func (r *report) save(p *plot.Plot, file, caption string) error {
	if err := p.Save(8*vg.Inch, 4.5*vg.Inch, filepath.Join(r.cfg.Out, file)); err != nil {
		return fmt.Errorf("plot %s: %w", file, err)
	}
	r.plots = append(r.plots, file)
	r.mdf("\n![%s](%s)\n", caption, file)
	return nil
}

// qualityPlots draws, for one workload at its loaded point: the TTFT CDF per mode, the hit rate
// per mode against both bounds, and the per-worker load over time for kv and round robin.
func (r *report) qualityPlots(w workload, set *loadedSet, inf, pooled float64) error {
	if len(set.runs) == 0 {
		return nil
	}
	scale := set.runs[0].scale
	// TTFT CDF, log time axis.
	p := plot.New()
	p.Title.Text = fmt.Sprintf("TTFT CDF, %s, arrivals ×%g, %d workers", w.name, scale, fleetWorkers)
	p.X.Label.Text = "TTFT (ms, log scale)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	for i, q := range set.runs {
		l, err := plotter.NewLine(cdf(q.res.TTFT))
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(q.name(), l)
	}
	p.Add(plotter.NewGrid())
	if err := r.save(p, "ttft-cdf-"+w.name+".png", "TTFT CDF per routing mode, "+w.name); err != nil {
		return err
	}

	// Hit rate per mode, with the two bounds as horizontal lines.
	p = plot.New()
	p.Title.Text = fmt.Sprintf("Prefix hit rate, %s, arrivals ×%g", w.name, scale)
	p.Y.Label.Text = "prompt tokens served from cache (%)"
	vals := make(plotter.Values, len(set.runs))
	names := make([]string, len(set.runs))
	for i, q := range set.runs {
		vals[i] = 100 * q.res.HitRate()
		names[i] = q.name()
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(40))
	if err != nil {
		return err
	}
	bars.Color = plotutil.Color(0)
	p.Add(bars)
	p.NominalX(names...)
	for i, b := range []struct {
		name string
		v    float64
	}{{"infinite-cache bound", inf}, {"pooled-cache bound", pooled}} {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 100 * b.v}, {X: float64(len(vals)) - 0.5, Y: 100 * b.v}})
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i + 1)
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add(b.name, l)
	}
	p.Y.Min = 0
	p.Y.Max = 100 * max(inf, pooled) * 1.15
	p.Legend.Top = true
	if err := r.save(p, "hit-rate-"+w.name+".png", "prefix hit rate per routing mode, "+w.name); err != nil {
		return err
	}

	// Per-worker requests in the worker (running + waiting) over time, kv and round robin.
	for _, q := range set.runs {
		if q.name() != "kv" && q.name() != "round_robin" || len(q.res.Samples) == 0 {
			continue
		}
		p = plot.New()
		p.Title.Text = fmt.Sprintf("Requests per worker (running + waiting), %s, %s, arrivals ×%g", q.mode, w.name, scale)
		p.X.Label.Text = "simulated time (s)"
		p.Y.Label.Text = "requests"
		for wi := range fleetWorkers {
			xy := make(plotter.XYs, len(q.res.Samples))
			for i, s := range q.res.Samples {
				xy[i] = plotter.XY{X: s.At.Seconds(), Y: float64(s.Running[wi] + s.Waiting[wi])}
			}
			l, err := plotter.NewLine(xy)
			if err != nil {
				return err
			}
			l.Color = plotutil.Color(wi)
			p.Add(l)
		}
		p.Add(plotter.NewGrid())
		if err := r.save(p, fmt.Sprintf("load-%s-%s.png", w.name, q.mode), fmt.Sprintf("per-worker load over time, %s, %s", q.mode, w.name)); err != nil {
			return err
		}
	}
	return nil
}

// cdf is the empirical distribution of the positive durations, in ms, thinned to at most about
// 500 points.
func cdf(ds []time.Duration) plotter.XYs {
	v := make([]float64, 0, len(ds))
	for _, d := range ds {
		if d > 0 {
			v = append(v, ms(d))
		}
	}
	slices.Sort(v)
	step := max(1, len(v)/500)
	xy := make(plotter.XYs, 0, len(v)/step+1)
	for i := 0; i < len(v); i += step {
		xy = append(xy, plotter.XY{X: v[i], Y: float64(i+1) / float64(len(v))})
	}
	if n := len(v); n > 0 && xy[len(xy)-1].X != v[n-1] {
		xy = append(xy, plotter.XY{X: v[n-1], Y: 1})
	}
	return xy
}
