package daemon

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestFormerNames: a metric renamed to the kvrouterd_ prefix is also exported under its former
// kvr_ name, with the same value, its help saying which name replaces it.
func TestFormerNames(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "kvrouterd_snapshot_writes_total", Help: "Snapshots written."})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvrouterd_snapshot_last_bytes", Help: "Size."})
	reg.MustRegister(c, g, formerNames(named{c, "snapshot_writes_total"}, named{g, "snapshot_last_bytes"}))
	c.Add(3)
	g.Set(42)
	want := `
# HELP kvr_snapshot_last_bytes Deprecated: the same as kvrouterd_snapshot_last_bytes, which replaces it.
# TYPE kvr_snapshot_last_bytes gauge
kvr_snapshot_last_bytes 42
# HELP kvr_snapshot_writes_total Deprecated: the same as kvrouterd_snapshot_writes_total, which replaces it.
# TYPE kvr_snapshot_writes_total counter
kvr_snapshot_writes_total 3
# HELP kvrouterd_snapshot_writes_total Snapshots written.
# TYPE kvrouterd_snapshot_writes_total counter
kvrouterd_snapshot_writes_total 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvr_snapshot_last_bytes", "kvr_snapshot_writes_total", "kvrouterd_snapshot_writes_total"); err != nil {
		t.Fatal(err)
	}
}
