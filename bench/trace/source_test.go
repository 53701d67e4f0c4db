package trace

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// streamFile collects MooncakeSource over a testdata file.
func streamFile(t *testing.T, name string, opt MooncakeOptions) ([]Request, error) {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src := MooncakeSource(f, opt)
	var reqs []Request
	for {
		r, ok := src.Next()
		if !ok {
			return reqs, src.Err()
		}
		reqs = append(reqs, r)
	}
}

// TestMooncakeSourceMatchesRead: streamed, every time-ordered form gives exactly what the
// whole-file loader gives: arrivals, tokens, outputs and sessions.
func TestMooncakeSourceMatchesRead(t *testing.T) {
	cases := []struct {
		file string
		opt  MooncakeOptions
	}{
		{"mooncake_small.jsonl", MooncakeOptions{}},
		{"mooncake_small.jsonl", MooncakeOptions{Limit: 3, TimeScale: 0.5, Seed: 7}},
		{"qwen_blksz16.jsonl", MooncakeOptions{}},
		{"qwen_blksz16.jsonl", MooncakeOptions{TimeUnit: time.Millisecond}},
	}
	for _, c := range cases {
		want := loadFixture(t, c.file, c.opt)
		got, err := streamFile(t, c.file, c.opt)
		if err != nil {
			t.Fatalf("%s %+v: %v", c.file, c.opt, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s %+v: %d requests streamed, %d loaded", c.file, c.opt, len(got), len(want))
		}
		for i := range want {
			if !reflect.DeepEqual(got[i], want[i]) {
				t.Errorf("%s %+v: request %d streamed as %+v, loaded as %+v", c.file, c.opt, i, got[i], want[i])
			}
		}
	}
	// ISO-8601 times, in order, from the first.
	iso := `{"timestamp": "2024-05-10T12:00:01Z", "output_length": 1, "token_ids": [1]}
{"timestamp": "2024-05-10T12:00:02.5Z", "output_length": 1, "token_ids": [2], "session_id": "a"}
`
	want, err := ReadMooncake(strings.NewReader(iso), MooncakeOptions{})
	if got := Collect(MooncakeSource(strings.NewReader(iso), MooncakeOptions{})); err != nil || !reflect.DeepEqual(got, want) || want[1].At != 1500*time.Millisecond {
		t.Errorf("ISO-8601: streamed %+v, loaded %+v (%v)", got, want, err)
	}
	// The real traces, whose timestamps are epoch-free milliseconds, in part.
	path := filepath.Join(traceDir(), "conversation_trace.jsonl")
	if _, err := os.Stat(path); err == nil {
		opt := MooncakeOptions{Limit: 500}
		want, err := LoadMooncake(path, opt)
		if err != nil {
			t.Fatal(err)
		}
		f, _ := os.Open(path)
		defer f.Close()
		got := Collect(MooncakeSource(f, opt))
		if !reflect.DeepEqual(got, want) {
			t.Error("the conversation trace streams differently from its load")
		}
	}
}

// TestMooncakeSourceErrors: a row out of time order, and a bad row, stop the stream with an
// error naming the line.
func TestMooncakeSourceErrors(t *testing.T) {
	var re *RowError
	for _, name := range []string{"mooncake_unsorted.jsonl", "tokens_iso.jsonl"} {
		_, err := streamFile(t, name, MooncakeOptions{})
		if !errors.As(err, &re) || re.Field != "timestamp" || !strings.Contains(err.Error(), "time order") {
			t.Errorf("%s, out of time order: %v, want a timestamp RowError about time order", name, err)
		}
	}
	src := MooncakeSource(strings.NewReader(`{"timestamp": 0, "input_length": 2, "output_length": 1, "token_ids": [1, 2]}
{"timestamp": 1, "input_length": 2}
`), MooncakeOptions{})
	if _, ok := src.Next(); !ok {
		t.Fatalf("the good row: %v", src.Err())
	}
	if _, ok := src.Next(); ok || !errors.As(src.Err(), &re) || re.Line != 2 || re.Field != "output_length" {
		t.Errorf("the bad row: %v", src.Err())
	}
	if _, err := streamFile(t, "mooncake_small.jsonl", MooncakeOptions{TimeScale: -1}); err == nil {
		t.Error("TimeScale -1: no error")
	}
}

// TestSources: SyntheticSource yields what Synthetic returns (Synthetic collects it), in bounded
// state; ScaleSource is Scale; SliceSource yields its slice.
func TestSources(t *testing.T) {
	cfg := DefaultSynthetic()
	cfg.Duration = time.Minute
	want := Synthetic(cfg)
	got := Collect(ScaleSource(SyntheticSource(cfg), 0.5))
	if !reflect.DeepEqual(got, Scale(want, 0.5)) {
		t.Error("ScaleSource(SyntheticSource) differs from Scale(Synthetic)")
	}
	if back := Collect(SliceSource(want)); !reflect.DeepEqual(back, want) {
		t.Error("SliceSource does not yield its slice")
	}
	if len(want) < 100 {
		t.Fatalf("a minute of the default workload has %d requests", len(want))
	}
	if Collect(SyntheticSource(SyntheticConfig{})) != nil {
		t.Error("a config without rate yields requests")
	}
}
