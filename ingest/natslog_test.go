package ingest

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/syncbuf"
)

// TestEmbeddedDebugLog: at debug level the embedded server's notices are logged, one per line,
// without its ASCII-art logo or the blank and ruled lines around them.
func TestEmbeddedDebugLog(t *testing.T) {
	var buf syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := StartEmbedded(EmbeddedConfig{Dir: t.TempDir(), Listen: "127.0.0.1:0", NoAuth: true, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	out := buf.String()
	if !strings.Contains(out, "JETSTREAM") || !strings.Contains(out, "Store Directory") {
		t.Fatalf("the server's notices are not logged:\n%s", out)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		msg := l[strings.Index(l, "msg=")+4:]
		if strings.Contains(msg, "_ ___") || strings.Contains(msg, "docs.nats.io/jetstream") || strings.Trim(msg, `"nats:- `) == "" {
			t.Errorf("logged: %s", l)
		}
	}
}
