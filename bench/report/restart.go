package main

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
)

// restart runs the daemon's restart benchmark (package cmd/kvrouterd: the built binary started
// on a data directory holding a snapshot, timed to ready) and reports its numbers.
func (r *report) restart() error {
	args := []string{"test", "-run", "^$", "-bench", "^BenchmarkRestart$", "-benchtime", "3x", "./cmd/kvrouterd/"}
	residencies := "10^7"
	if r.cfg.Quick {
		args = append(args, "-short")
		residencies = "10^6"
	}
	r.logf("restart: go %v (builds the daemon, writes a snapshot of %s residencies, starts it 3 times)", args, residencies)
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("go test: %w\n%s", err, out)
	}
	metric := func(unit string) (float64, error) {
		m := regexp.MustCompile(`([0-9.]+) ` + regexp.QuoteMeta(unit) + `\b`).FindSubmatch(out)
		if m == nil {
			return 0, fmt.Errorf("no %s in the benchmark's output:\n%s", unit, bytes.TrimSpace(out))
		}
		return strconv.ParseFloat(string(m[1]), 64)
	}
	ready, err := metric("ready-ms")
	if err != nil {
		return err
	}
	restore, err := metric("restore-ms")
	if err != nil {
		return err
	}
	rate, err := metric("residencies/s")
	if err != nil {
		return err
	}
	r.logf("restart: ready in %.0f ms, restore %.0f ms", ready, restore)
	cond := fmt.Sprintf("snapshot of %s residencies (workers × 10^4 blocks, 60 %% from shared prefixes), built binary with its embedded NATS, median of 3 starts; %s", residencies, machine())
	r.mdf("\n## Restart\n\n`go %s`: the daemon started on a data directory holding a snapshot of %s residencies, timed "+
		"from process start to ready (median of 3 starts): **%.0f ms**, of which the restore %.0f ms (%.1f M residencies/s). "+
		"Target: ≤ 0.5 s at 10^7.\n", joinArgs(args), residencies, ready, restore, rate/1e6)
	r.add("restart.ready", ready, "ms", cond)
	r.add("restart.restore", restore, "ms", cond)
	r.add("restart.restore_rate", rate, "residencies/s", cond)
	r.headline("restart: process start to ready, "+residencies+" residencies; of which restore",
		mdPrinter.Sprintf("%.0f ms; %.0f ms", ready, restore), "≤ 0.5 s at 10^7", r.command("restart"))
	return nil
}

func joinArgs(a []string) string {
	var b bytes.Buffer
	for i, s := range a {
		if i > 0 {
			b.WriteByte(' ')
		}
		if s == "^$" || s == "^BenchmarkRestart$" {
			s = "'" + s + "'"
		}
		b.WriteString(s)
	}
	return b.String()
}
