package main

import (
	"fmt"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// The load sweep: each mode's TTFT and hit rate against offered load, and its knee, the load
// at which its p99 TTFT reaches the workload's objective, kneeFactor × round robin's unloaded
// p99 (the one goodput counts within): one bar for every mode, so that a mode slow even
// unloaded does not earn a later knee. The knee against a mode's own unloaded p99 (its
// degradation, not its capacity) is reported beside it.
const (
	kneeFactor = 2
	// sweepPast is how far past the knee the sweep goes (p99 over unloaded) to draw the curve.
	sweepPast = 8
)

// sweepLadder is the arrival-time scales of the sweep, lightest load first, in steps of about
// √2 in load: fine enough that the knee falls between two points at most 41 % apart, which
// the interpolation then narrows.
var sweepLadder = []float64{2, 1.4, 1, 0.7, 0.5, 0.35, 0.25, 0.18, 0.13, 0.09, 0.065, 0.045, 0.032, 0.022, 0.016, 0.011, 0.008, 0.0055, 0.004}

// sweepPoint is one simulation of the sweep.
type sweepPoint struct {
	load float64 // offered requests/s
	q    qualityRun
}

// kneeResult is one mode's sweep: its unloaded p99, the points, and the knee in requests/s
// (at the objective slo, and own at kneeFactor × its unloaded p99); below (above) says the
// knee is under the lightest (over the heaviest) load tried, the figure then the bound it is
// past.
type kneeResult struct {
	routing      routing
	unloadedP99  float64 // ms
	slo          float64 // ms
	points       []sweepPoint
	knee         float64
	below, above bool
	own          float64
	ownBelow     bool
	ownAbove     bool
}

// offered is the request rate of w's arrivals at scale s.
func offered(w workload, s float64) float64 {
	if len(w.reqs) < 2 {
		return 0
	}
	span := (w.reqs[len(w.reqs)-1].At - w.reqs[0].At).Seconds() * s
	if span <= 0 {
		return 0
	}
	return float64(len(w.reqs)) / span
}

// sweep runs mode over the ladder until its p99 TTFT is sweepPast × the unloaded one and past
// the objective slo (ms).
func (r *report) sweep(w workload, rt routing, blocks int, slo float64) (kneeResult, error) {
	k := kneeResult{routing: rt, slo: slo}
	un, err := r.simulateRouting(w, rt, unloadedScale, blocks, 0)
	if err != nil {
		return k, err
	}
	k.unloadedP99 = ms(un.ttft.p99)
	for _, s := range sweepLadder {
		q, err := r.simulateRouting(w, rt, s, blocks, 0)
		if err != nil {
			return k, err
		}
		k.points = append(k.points, sweepPoint{offered(w, s), q})
		if p99 := ms(q.ttft.p99); p99 >= sweepPast*k.unloadedP99 && p99 >= slo {
			break
		}
	}
	k.knee, k.below, k.above = knee(slo, k.points)
	k.own, k.ownBelow, k.ownAbove = knee(k.unloadedP99*kneeFactor, k.points)
	return k, nil
}

// knee is where the p99 TTFT of points (by rising load) first reaches at, interpolated
// linearly in log load and log TTFT between the last point below and the first at or above.
func knee(at float64, points []sweepPoint) (load float64, below, above bool) {
	if len(points) == 0 {
		return 0, false, true
	}
	for i, p := range points {
		y := ms(p.q.ttft.p99)
		if y < at {
			continue
		}
		if i == 0 {
			return p.load, true, false
		}
		lo := points[i-1]
		y0 := ms(lo.q.ttft.p99)
		f := (math.Log(at) - math.Log(y0)) / (math.Log(y) - math.Log(y0))
		return math.Exp(math.Log(lo.load) + f*(math.Log(p.load)-math.Log(lo.load))), false, false
	}
	return points[len(points)-1].load, false, true
}

// knees sweeps every mode on w, reports each knee at the objective slo (ms;
// quality.NAME.knee.MODE, requests/s) and against its own unloaded p99
// (quality.NAME.knee_own.MODE), and draws p99 TTFT and hit rate against offered load.
func (r *report) knees(w workload, blocks int, slo float64) ([]kneeResult, error) {
	var ks []kneeResult
	for _, rt := range routings {
		k, err := r.sweep(w, rt, blocks, slo)
		if err != nil {
			return nil, err
		}
		ks = append(ks, k)
	}
	r.mdf("\n**Load sweep.** Each mode at arrival scales %v (lightest first, until its p99 TTFT is %d× its unloaded "+
		"p99 and past the objective); its *knee* is the offered load at which its p99 TTFT reaches the objective, %.0f ms "+
		"(%d× round robin's unloaded p99, the bar goodput counts within; interpolated in log–log between the two points "+
		"around it). The same bar for every mode: a knee against each mode's own unloaded p99 (last column) measures how "+
		"much it degrades, and rewards a mode that is slow even unloaded.\n\n"+
		"| mode | unloaded p99 ms | knee (requests/s) | knee at %d× its own unloaded p99 | points |\n|---|---:|---:|---:|---:|\n",
		sweepLadder, sweepPast, slo, kneeFactor, kneeFactor)
	for _, k := range ks {
		note, ownNote := kneeNote(k.below, k.above), kneeNote(k.ownBelow, k.ownAbove)
		r.mdf("| %s | %.0f | %.2f%s | %.2f%s | %d |\n", k.routing, k.unloadedP99, k.knee, note, k.own, ownNote, len(k.points))
		r.add(fmt.Sprintf("quality.%s.knee.%s", w.name, k.routing), k.knee, "requests/s",
			fmt.Sprintf("%s; %d simulated workers × %d blocks of %d tokens; the offered load at which %s's p99 TTFT reaches %.0f ms (%d× round robin's unloaded p99)%s; seed %d",
				w.about, fleetWorkers, blocks, blockSize, k.routing, slo, kneeFactor, note, r.cfg.Seed))
		r.add(fmt.Sprintf("quality.%s.knee_own.%s", w.name, k.routing), k.own, "requests/s",
			fmt.Sprintf("%s; %d simulated workers × %d blocks of %d tokens; the offered load at which %s's p99 TTFT is %d× its own unloaded %.0f ms%s; seed %d",
				w.about, fleetWorkers, blocks, blockSize, k.routing, kneeFactor, k.unloadedP99, ownNote, r.cfg.Seed))
	}
	return ks, r.sweepPlots(w, ks)
}

// kneeNote says when a knee is a bound: past at the lightest load tried, or not reached at
// the heaviest.
func kneeNote(below, above bool) string {
	switch {
	case below:
		return " (already past at the lightest load tried: at most this)"
	case above:
		return " (not reached at the heaviest load tried: at least this)"
	}
	return ""
}

// sweepPlots draws p99 TTFT (log) and hit rate against offered load, a line per mode, each
// knee marked.
func (r *report) sweepPlots(w workload, ks []kneeResult) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("p99 TTFT against offered load, %s, %d workers", w.name, fleetWorkers)
	p.X.Label.Text = "offered load (requests/s, log scale)"
	p.Y.Label.Text = "p99 TTFT (ms, log scale)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	h := plot.New()
	h.Title.Text = fmt.Sprintf("Prefix hit rate against offered load, %s", w.name)
	h.X.Label.Text = "offered load (requests/s, log scale)"
	h.Y.Label.Text = "prompt tokens served from cache (%)"
	h.X.Scale, h.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	for i, k := range ks {
		var ttft, hit plotter.XYs
		for _, pt := range k.points {
			if pt.load <= 0 || pt.q.ttft.p99 <= 0 {
				continue
			}
			ttft = append(ttft, plotter.XY{X: pt.load, Y: ms(pt.q.ttft.p99)})
			hit = append(hit, plotter.XY{X: pt.load, Y: 100 * pt.q.res.HitRate()})
		}
		if len(ttft) == 0 {
			continue
		}
		for _, d := range []struct {
			p  *plot.Plot
			xy plotter.XYs
		}{{p, ttft}, {h, hit}} {
			l, s, err := plotter.NewLinePoints(d.xy)
			if err != nil {
				return err
			}
			l.Color, s.Color, s.Shape = plotutil.Color(i), plotutil.Color(i), plotutil.Shape(i)
			l.Width = vg.Points(1.5)
			d.p.Add(l, s)
			d.p.Legend.Add(k.routing.String(), l, s)
		}
		if !k.below && !k.above && k.knee > 0 {
			m, err := plotter.NewScatter(plotter.XYs{{X: k.knee, Y: k.slo}})
			if err != nil {
				return err
			}
			m.Color, m.Shape, m.Radius = plotutil.Color(i), plotutil.Shape(i), vg.Points(6)
			p.Add(m)
		}
	}
	p.Add(plotter.NewGrid())
	h.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true
	h.Legend.Top = true
	if err := r.save(p, "sweep-ttft-"+w.name+".png", "p99 TTFT against offered load per routing mode (knees marked), "+w.name); err != nil {
		return err
	}
	return r.save(h, "sweep-hit-"+w.name+".png", "prefix hit rate against offered load per routing mode, "+w.name)
}
