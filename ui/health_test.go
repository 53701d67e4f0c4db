package ui_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/ui"
)

// TestStatusWorkerHealth: the document carries each rank's standing with the outlier
// ejection: ok, suspect, or ejected with the time left before its probe.
func TestStatusWorkerHealth(t *testing.T) {
	r := router.New(router.Config{BlockSize: 16, Shards: 1, Logger: slog.New(slog.DiscardHandler),
		Eject: router.EjectConfig{BaseTime: time.Minute}})
	defer r.Close()
	for id := range uint64(3) {
		if err := r.Register(router.Registration{ID: id, Model: "m"}); err != nil {
			t.Fatal(err)
		}
	}
	r.UpstreamFailed(0, 0, "connect")
	r.UpstreamFailed(1, 0, "5xx")
	st := ui.New(ui.Config{Router: r}).Status(time.Now())
	want := []string{router.HealthEjected, router.HealthSuspect, router.HealthOK}
	for i, w := range st.Workers {
		if w.Health != want[i] {
			t.Fatalf("worker %s: health %q, want %q", w.WorkerID, w.Health, want[i])
		}
		if ejected := w.Health == router.HealthEjected; ejected != (w.EjectedForSeconds != nil) {
			t.Fatalf("worker %s: ejected_for_seconds %v", w.WorkerID, w.EjectedForSeconds)
		}
	}
	if left := *st.Workers[0].EjectedForSeconds; left < 50 || left > 60 || st.Workers[0].Ejections != 1 {
		t.Fatalf("ejected worker: %v s left, %d ejections; want about 60 s, 1", left, st.Workers[0].Ejections)
	}
}
