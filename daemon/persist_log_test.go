package daemon

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/syncbuf"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSnapshotLogUnchanged: a snapshot that holds what the one before held is written but not
// logged at info level, so an idle daemon's log does not grow by a line per interval; one that
// covers more of the stream is.
func TestSnapshotLogUnchanged(t *testing.T) {
	var buf syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	c := Defaults()
	c.DataDir = t.TempDir()
	p, err := openPersist(c, prometheus.NewRegistry(), log, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	r := router.New(router.Config{BlockSize: 16, Shards: 1, Logger: slog.New(slog.DiscardHandler)})
	defer r.Close()
	for _, seq := range []uint64{5, 5, 5, 6} {
		if err := p.write(r, seq); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(buf.String(), `msg="snapshot written"`); n != 2 {
		t.Errorf("%d info lines for 4 writes of 2 distinct states, want 2:\n%s", n, buf.String())
	}
	if got := testutil.ToFloat64(p.writes); got != 4 {
		t.Errorf("%v writes counted, want 4", got)
	}
}
