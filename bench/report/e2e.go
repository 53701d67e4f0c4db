package main

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/e2e"
	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/scoring"
)

// e2ePace is the simulated seconds per wall second of the end-to-end run: the hour-long
// conversation trace in a minute, which the daemon keeps up with on 2 cores with room to spare.
const e2ePace = 60

// e2e replays the conversation trace, and each --trace, against a whole daemon started in
// process (router, HTTP server on a loopback port, embedded NATS and its consumer), through the
// binary HTTP client and JetStream, and compares it with the in-process simulation of the same
// requests.
func (r *report) e2e() error {
	limit := 0
	if r.cfg.Quick {
		limit = 2500
	}
	path := filepath.Join(r.cfg.Traces, "mooncake", "conversation_trace.jsonl")
	reqs, err := trace.LoadMooncake(path, trace.MooncakeOptions{Limit: limit})
	if err != nil {
		r.mdf("\n## End to end\n\n*Not measured: %v.*\n", err)
		r.logf("e2e: %v (skipped)", err)
		r.missing("e2e", "the conversation trace through a whole daemon", err)
	} else if err := r.e2eTrace("", "Mooncake conversation trace", reqs, false); err != nil {
		return err
	}
	for _, t := range r.cfg.Extra {
		w, err := r.extra(t)
		if err != nil {
			return err
		}
		if err := r.e2eTrace(t.Name, w.about, w.reqs, w.closedLoop); err != nil {
			return fmt.Errorf("--trace %s: %w", t.Name, err)
		}
	}
	return nil
}

// e2eTrace is the end-to-end run of one trace, its rows named e2e.NAME.… (name empty: the
// conversation trace's, e2e.…, with the headline).
func (r *report) e2eTrace(name, about string, reqs []trace.Request, closed bool) error {
	key, heading := "e2e.", "\n## End to end\n\n"
	if name != "" {
		key, heading = "e2e."+name+".", "\n### End to end: "+name+"\n\n"
	}
	st := trace.Summarize(reqs)
	wc := sim.DefaultWorkerConfig()
	wc.BlockSize, wc.Blocks = blockSize, kvBlocks
	fc := fleet.Config{Workers: fleetWorkers, Mode: scoring.KV, Worker: wc, Seed: r.cfg.Seed, ClosedLoop: closed}
	kvDefault(&fc) // the daemon's default, as the daemon below routes
	t0 := time.Now()
	local, err := fleet.Run(fc, reqs)
	if err != nil {
		return err
	}
	r.logf("e2e: in process: %d requests in %v", st.Requests, time.Since(t0).Round(10*time.Millisecond))
	fc.Pace = e2ePace
	r.logf("e2e: against a daemon over HTTP and NATS, %v of trace at %d× (about %v)", st.Duration.Round(time.Second), e2ePace,
		(st.Duration / e2ePace).Round(time.Second))
	t0 = time.Now()
	res, err := e2e.Run(e2e.Config{Fleet: fc}, reqs)
	if err != nil {
		return err
	}
	wall := time.Since(t0)
	lat := summarize(res.RouteLatency)
	r.logf("e2e: done in %v: route p50 %v, p99 %v, max lag %v", wall.Round(100*time.Millisecond), lat.p50, lat.p99, res.MaxLag)
	lq, rq := summarize(local.TTFT), summarize(res.TTFT)
	r.mdf(heading+"The %s (%d requests, %v) on %d simulated workers as in the routing-quality section, at trace speed, "+
		"but routed by a whole daemon (package `bench/e2e`: router, HTTP server on a loopback port, embedded NATS JetStream and its "+
		"consumer, started in this process): every route, prefill-done and complete call goes through the binary HTTP client, and "+
		"the workers' KV events are published to JetStream without waiting, as engines publish them. The simulated clock runs at "+
		"%d× wall time so that the daemon applies events on its own schedule; routing then sees the index as a live daemon would.\n\n",
		about, st.Requests, st.Duration.Round(time.Second), fleetWorkers, e2ePace)
	r.mdf("| | TTFT mean / p99 ms | hit rate | imbalance |\n|---|---:|---:|---:|\n")
	r.mdf("| in process | %.0f / %.0f | %.1f %% | %.2f |\n", ms(lq.mean), ms(lq.p99), 100*local.HitRate(), local.Imbalance())
	r.mdf("| daemon over HTTP and NATS | %.0f / %.0f | %.1f %% | %.2f |\n\n", ms(rq.mean), ms(rq.p99), 100*res.HitRate(), res.Imbalance())
	r.mdf("Route calls over HTTP: p50 %.0f µs, p99 %.0f µs, p99.9 %.0f µs (client side, wall time, %d calls, %d failed); "+
		"%d event batches published (%d refused); the simulation fell at most %v behind its pace; the daemon had applied every "+
		"event %v after the last step; wall time %v.\n", us(lat.p50), us(lat.p99), us(lat.p999), len(res.RouteLatency), res.RouteFailures,
		res.Published.Batches, res.Published.Errors, res.MaxLag.Round(100*time.Microsecond), res.Drain.Round(100*time.Microsecond),
		wall.Round(100*time.Millisecond))
	cond := fmt.Sprintf("%s, %d requests at trace speed; %d simulated workers × %d blocks of %d tokens; kv; daemon in process, simulated clock at %d× wall time; %s",
		about, st.Requests, fleetWorkers, kvBlocks, blockSize, e2ePace, machine())
	r.add(key+"route_p50", us(lat.p50), "µs", cond)
	r.add(key+"route_p99", us(lat.p99), "µs", cond)
	r.add(key+"route_p999", us(lat.p999), "µs", cond)
	r.add(key+"route_failures", float64(res.RouteFailures), "requests", cond)
	r.add(key+"max_lag", ms(res.MaxLag), "ms", cond)
	r.add(key+"ttft_mean", ms(rq.mean), "ms", cond)
	r.add(key+"hit_rate", 100*res.HitRate(), "%", cond)
	r.add(key+"in_process_hit_rate", 100*local.HitRate(), "%", cond)
	if name != "" {
		return nil
	}
	r.headline(mdPrinter.Sprintf("end to end: conversation trace through a whole daemon (HTTP + NATS), %d workers: route p50 / p99; hit rate (in process)", fleetWorkers),
		mdPrinter.Sprintf("%.0f / %.0f µs; %.1f %% (%.1f %%)", us(lat.p50), us(lat.p99), 100*res.HitRate(), 100*local.HitRate()), "—", r.command("e2e"))
	return nil
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }
