package main

import (
	"fmt"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
)

// The router queue under saturation: kv routing with the queue off and under each policy, at
// the lightest load of the ladder at which kv's own mean TTFT (queue off) is loadFactor × its
// unloaded value, so that the workers, not the routing, are what limits.
const (
	// queueThreshold is the threshold of the policy rows (× max_num_batched_tokens): Dynamo
	// v1.x's default, the one its users bring.
	queueThreshold = 4.0
	// highPriorityJump is the priority jump of a high-priority request, in seconds (Dynamo's
	// nvext.agent_hints.priority; 10 is the value of Dynamo's own examples).
	highPriorityJump = 10.0
)

// queuePolicies are the policy rows' settings, "off" first.
var queuePolicies = []string{"off", "fcfs", "wspt", "lcfs"}

// queueThresholds are the thresholds swept under fcfs.
var queueThresholds = []float64{0.25, 0.5, 1, 2, 4, 8}

// highPriority picks a fifth of the requests, by a hash of their index (deterministic, spread
// over the trace, unrelated to their size or arrival).
func highPriority(i int) bool {
	x := uint64(i) + 0x9e3779b97f4a7c15 // splitmix64's finalizer
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return x%5 == 0
}

// queueConfig is the section's queue: unbounded in length and wait, so that every request is
// served and measured (a refused request would leave the TTFT figures and flatter the queue).
func queueConfig(policy router.QueuePolicy, threshold float64) *router.QueueConfig {
	return &router.QueueConfig{Threshold: threshold, Policy: policy, MaxRequests: 1 << 30, MaxWait: 1000 * time.Hour}
}

// queue measures the router queue on w (the conversation trace) at its saturation point.
func (r *report) queue(w workload) error {
	unloaded, loaded, err := r.loadPoint(w, scoring.KV, kvBlocks)
	if err != nil {
		return err
	}
	s := loaded.scale
	ratio := float64(loaded.ttft.mean) / float64(unloaded.ttft.mean)
	r.mdf("\n### Router queue under saturation (%s)\n\n", w.about)
	r.mdf("kv routing, the router queue (package `router`, `Router.Enqueue`) in front of the simulated fleet as the front door "+
		"holds a request while it waits: a queued request starts on its worker at the simulated time of the prefill-done or "+
		"completion that admitted it, and its TTFT counts from its arrival. Workers register max_num_batched_tokens = 8,192. "+
		"Load: arrivals ×%g, the lightest of the ladder at which kv's mean TTFT without the queue is ≥ %d× its unloaded value "+
		"(%.0f ms → %.0f ms, %.1f×%s). Policy rows at threshold %g × max_num_batched_tokens; the queue is unbounded in length "+
		"and wait, so every request is served and counted. The priority rows mark a fifth of the requests (by a hash of their "+
		"index) with a priority jump of %g s (nvext.agent_hints.priority) under wspt.\n\n",
		s, loadFactor, ms(unloaded.ttft.mean), ms(loaded.ttft.mean), ratio,
		map[bool]string{true: "", false: fmt.Sprintf("; short of %d×: the heaviest load tried", loadFactor)}[ratio >= loadFactor],
		queueThreshold, highPriorityJump)
	cond := func(what string) string {
		return fmt.Sprintf("%s, %d requests, arrival times ×%g; %d simulated workers × %d blocks of %d tokens, max_num_batched_tokens 8192; kv, overlap weight 1; %s; seed %d",
			w.about, len(w.reqs), s, fleetWorkers, kvBlocks, blockSize, what, r.cfg.Seed)
	}
	run := func(policy string, threshold float64, prio func(int) float64) (qualityRun, error) {
		fc := fleet.Config{Mode: scoring.KV, Priority: prio}
		label := "queue " + policy
		if policy != "off" {
			p, err := router.ParseQueuePolicy(policy)
			if err != nil {
				return qualityRun{}, err
			}
			fc.Queue = queueConfig(p, threshold)
			label += fmt.Sprintf(" %g", threshold)
		}
		q, err := r.simulateFleet(w, s, fc, kvBlocks, label)
		if err == nil && (q.res.RouteFailures > 0 || q.res.QueueTimedOut > 0 || q.res.Booked != 0) {
			err = fmt.Errorf("%s ×%g %s: %d route failures (%s), %d timed out, %d left booked", w.name, s, label,
				q.res.RouteFailures, q.res.RouteErr, q.res.QueueTimedOut, q.res.Booked)
		}
		return q, err
	}
	// row writes one table row; in, if set, restricts the queue columns to some requests.
	row := func(name string, q qualityRun, ttft dist, in func(int) bool) {
		res := q.res
		var wait time.Duration
		n, queued := 0, res.Queued
		if in != nil {
			queued = 0
		}
		for i, d := range res.QueueWait {
			if in == nil || in(i) {
				wait += d
				n++
				if in != nil && d > 0 {
					queued++
				}
			}
		}
		if n > 0 {
			wait /= time.Duration(n)
		}
		longest := mdPrinter.Sprint(res.MaxQueued)
		if in != nil {
			longest = "—"
		}
		r.mdf("| %s | %.0f / %.0f / %.0f | %.1f %% | %d | %s | %.0f |\n", name, ms(ttft.mean), ms(ttft.p50), ms(ttft.p99),
			100*res.HitRate(), queued, longest, ms(wait))
	}
	r.mdf("| queue | TTFT mean / p50 / p99 ms | hit rate | requests queued | longest queue | mean queue wait ms |\n")
	r.mdf("|---|---:|---:|---:|---:|---:|\n")
	var curves []curve
	for _, p := range queuePolicies {
		q := loaded // kv without the queue at this load: run already (deterministic)
		if p != "off" {
			if q, err = run(p, queueThreshold, nil); err != nil {
				return err
			}
		}
		name := p
		if p != "off" {
			name = fmt.Sprintf("%s, threshold %g", p, queueThreshold)
		}
		row(name, q, q.ttft, nil)
		c := cond("queue off")
		if p != "off" {
			c = cond(fmt.Sprintf("router queue %s, threshold %g", p, queueThreshold))
		}
		key := fmt.Sprintf("quality.%s.queue.%s.", w.name, p)
		r.add(key+"ttft_mean", ms(q.ttft.mean), "ms", c)
		r.add(key+"ttft_p99", ms(q.ttft.p99), "ms", c)
		curves = append(curves, curve{p, q.res.TTFT})
	}

	// Priority: a fifth of the requests jump the wspt queue.
	jump := func(i int) float64 {
		if highPriority(i) {
			return highPriorityJump
		}
		return 0
	}
	q, err := run("wspt", queueThreshold, jump)
	if err != nil {
		return err
	}
	var high, low []time.Duration
	for i, d := range q.res.TTFT {
		if highPriority(i) {
			high = append(high, d)
		} else {
			low = append(low, d)
		}
	}
	hd, ld := summarize(high), summarize(low)
	row(fmt.Sprintf("wspt, threshold %g, all (a fifth with priority %g s)", queueThreshold, highPriorityJump), q, q.ttft, nil)
	row(fmt.Sprintf("of which high priority (%d requests)", len(high)), q, hd, highPriority)
	row(fmt.Sprintf("of which low priority (%d requests)", len(low)), q, ld, func(i int) bool { return !highPriority(i) })
	for _, c := range []struct {
		class string
		d     dist
		n     int
	}{{"high", hd, len(high)}, {"low", ld, len(low)}} {
		r.add(fmt.Sprintf("quality.%s.priority.%s.ttft_mean", w.name, c.class), ms(c.d.mean), "ms",
			cond(fmt.Sprintf("router queue wspt, threshold %g; %d requests of this class; a fifth of all with priority jump %g s", queueThreshold, c.n, highPriorityJump)))
	}
	curves = append(curves, curve{"wspt, high priority", high}, curve{"wspt, low priority", low})
	if err := r.queuePlot(w, s, curves); err != nil {
		return err
	}

	// The threshold under fcfs.
	r.mdf("\nThe threshold (× max_num_batched_tokens) under fcfs at the same load; *off* is no queue (an infinite threshold):\n\n")
	r.mdf("| threshold | TTFT mean / p50 / p99 ms | hit rate | requests queued | longest queue | mean queue wait ms |\n")
	r.mdf("|---|---:|---:|---:|---:|---:|\n")
	for _, th := range queueThresholds {
		q, err := run("fcfs", th, nil)
		if err != nil {
			return err
		}
		row(fmt.Sprintf("%g", th), q, q.ttft, nil)
		c := cond(fmt.Sprintf("router queue fcfs, threshold %g", th))
		key := fmt.Sprintf("quality.%s.queue.fcfs.threshold%g.", w.name, th)
		r.add(key+"ttft_mean", ms(q.ttft.mean), "ms", c)
		r.add(key+"ttft_p99", ms(q.ttft.p99), "ms", c)
	}
	row("off", loaded, loaded.ttft, nil)
	r.add(fmt.Sprintf("quality.%s.queue.load_scale", w.name), s, "×", cond("the saturation point of kv without the queue"))
	return r.sloQueue(w, s, unloaded, run, cond)
}

// sloQueue measures --ttft-slo: goodput (requests whose TTFT is within the objective, per
// second) with the objective off and on, at the saturation point and at a lighter load, the
// objective 2× (the knee's factor) kv's unloaded p99 TTFT, under fcfs at a threshold no rank
// reaches, so that the objective alone holds requests.
func (r *report) sloQueue(w workload, s float64, unloaded qualityRun, run func(string, float64, func(int) float64) (qualityRun, error),
	cond func(string) string) error {
	slo := time.Duration(kneeFactor * float64(unloaded.ttft.p99))
	r.mdf("\n**A TTFT objective** (`--ttft-slo %v`: 2× kv's unloaded p99): a request also waits while no rank is predicted to "+
		"give its first token within it. Goodput is the requests within the objective per second of the run.\n\n", slo.Round(time.Millisecond))
	r.mdf("| arrivals × | objective | TTFT mean / p99 ms | goodput (requests/s) | requests queued |\n|---:|---|---:|---:|---:|\n")
	for _, sc := range []float64{s, 2 * s} {
		for _, on := range []bool{false, true} {
			fc := fleet.Config{Mode: scoring.KV, Queue: &router.QueueConfig{Threshold: 1e6, MaxRequests: 1 << 30, MaxWait: 1000 * time.Hour}}
			label := "no objective"
			if on {
				fc.Queue.TTFTSLO = slo
				label = "ttft-slo " + slo.Round(time.Millisecond).String()
			}
			q, err := r.simulateFleet(w, sc, fc, kvBlocks, label)
			if err != nil {
				return err
			}
			gp := goodput(q.res, ms(slo))
			r.mdf("| %g | %s | %.0f / %.0f | %.2f | %d |\n", sc, label, ms(q.ttft.mean), ms(q.ttft.p99), gp, q.res.Queued)
			key := fmt.Sprintf("quality.%s.ttft_slo.x%g.%s.", w.name, sc, map[bool]string{false: "off", true: "on"}[on])
			c := cond(fmt.Sprintf("router queue fcfs at a threshold no rank reaches; objective %v %s", slo.Round(time.Millisecond), map[bool]string{false: "off", true: "on"}[on]))
			r.add(key+"goodput", gp, "requests/s", c)
			r.add(key+"ttft_mean", ms(q.ttft.mean), "ms", c)
		}
	}
	return nil
}

// curve is one line of a CDF plot.
type curve struct {
	name string
	ttft []time.Duration
}

// queuePlot draws the TTFT CDF of each queue setting and, dashed, each priority class.
func (r *report) queuePlot(w workload, s float64, curves []curve) error {
	return r.cdfPlot(fmt.Sprintf("TTFT CDF by router queue policy, %s, kv, arrivals ×%g, %d workers", w.name, s, fleetWorkers),
		"queue-ttft-cdf-"+w.name+".png", "TTFT CDF by router queue policy and priority class, "+w.name, curves, len(queuePolicies))
}
