package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/bench/tracecsv"
	"github.com/kvrouterd/kvrouterd/scoring"
)

type outRow struct {
	Timestamp    float64  `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// convertFile converts a testdata file and returns the output and its rows (header excluded).
func convertFile(t *testing.T, name string, blockSize int) ([]byte, []outRow) {
	t.Helper()
	in, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	st, err := convert(bytes.NewReader(in), &out, options{BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if want := `{"block_size":` + strconv.Itoa(blockSize) + `,"time_unit":"ms"}`; lines[0] != want {
		t.Fatalf("header %s, want %s", lines[0], want)
	}
	rows := make([]outRow, len(lines)-1)
	for i, l := range lines[1:] {
		if err := json.Unmarshal([]byte(l), &rows[i]); err != nil {
			t.Fatalf("output line %d: %v: %s", i+2, err, l)
		}
	}
	if st.Written != len(rows) || st.Rows != st.Written+st.EmptyPrompts {
		t.Fatalf("stats %+v for %d rows written", st, len(rows))
	}
	return out.Bytes(), rows
}

// TestSamples: real rows of both 2023 traces, with values checked by hand against the CSV.
func TestSamples(t *testing.T) {
	f := func(name string, blockSize, rows, row int, want outRow) {
		t.Helper()
		_, got := convertFile(t, name, blockSize)
		if len(got) != rows {
			t.Fatalf("%s: %d rows, want %d", name, len(got), rows)
		}
		if !equalRow(got[row], want) {
			t.Errorf("%s row %d at block size %d:\n got %+v\nwant %+v", name, row+1, blockSize, got[row], want)
		}
	}
	// 2023-11-16 18:15:46 UTC is 1700158546 s after the epoch; .6805900 s is 680.59 ms.
	f("conv_head.csv", 512, 20, 0, outRow{1700158546680.59, 374, 44, []uint64{0}})
	f("conv_head.csv", 512, 20, 1, outRow{1700158550995.169, 396, 109, []uint64{1}})
	// 18:15:54.4260870, 1313 tokens: three blocks of 512, after 7 blocks of rows 1 to 6.
	f("conv_head.csv", 512, 20, 6, outRow{1700158554426.087, 1313, 142, []uint64{7, 8, 9}})
	f("conv_head.csv", 1024, 20, 6, outRow{1700158554426.087, 1313, 142, []uint64{6, 7}})
	// 2023-11-16 18:17:03 is 1700158623; 4808 tokens are 10 blocks of 512, 301 of 16.
	f("code_head.csv", 512, 10, 0, outRow{1700158623979.96, 4808, 10, ids(0, 10)})
	f("code_head.csv", 16, 10, 0, outRow{1700158623979.96, 4808, 10, ids(0, 301)})
	f("code_head.csv", 16, 10, 9, outRow{1700158625279.297, 201, 24, ids(301+199+7+465+3+24+437+3+72, 13)})
}

func ids(from uint64, n int) []uint64 {
	v := make([]uint64, n)
	for i := range v {
		v[i] = from + uint64(i)
	}
	return v
}

func equalRow(a, b outRow) bool {
	d := a.Timestamp - b.Timestamp
	return d > -1e-3 && d < 1e-3 && a.InputLength == b.InputLength && a.OutputLength == b.OutputLength && slices.Equal(a.HashIDs, b.HashIDs)
}

// TestLoadAndReplay: the output loads with bench/trace at its own block size, keeps the
// trace's intervals, shares no prefix, and replays on a small simulated fleet.
func TestLoadAndReplay(t *testing.T) {
	for _, name := range []string{"conv_head.csv", "code_head.csv"} {
		out, rows := convertFile(t, name, 64)
		path := filepath.Join(t.TempDir(), "out.jsonl")
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		reqs, err := trace.LoadMooncake(path, trace.MooncakeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(reqs) != len(rows) {
			t.Fatalf("%s: loaded %d requests of %d rows", name, len(reqs), len(rows))
		}
		for i, r := range reqs {
			want := time.Duration((rows[i].Timestamp - rows[0].Timestamp) * 1e6)
			if d := r.At - want; d < -time.Microsecond || d > time.Microsecond || len(r.Tokens) != rows[i].InputLength || r.Output != rows[i].OutputLength {
				t.Fatalf("%s request %d: at %v, %d tokens, output %d; want %v, %+v", name, i, r.At, len(r.Tokens), r.Output, want, rows[i])
			}
		}
		// 18:15:50.9951690 − 18:15:46.6805900, to the loader's precision at epoch times.
		if d := reqs[1].At - 4314579*time.Microsecond; name == "conv_head.csv" && (d < -time.Microsecond || d > time.Microsecond) {
			t.Errorf("second request at %v, want 4.314579s", reqs[1].At)
		}
		if h := trace.CountHits(reqs, 16); h.Hits != 0 {
			t.Errorf("%s: %d prefix hits, want none: the trace has no prompt content", name, h.Hits)
		}
		res, err := fleet.Run(fleet.Config{
			Workers: 2, Mode: scoring.KV, Seed: 1,
			Worker: sim.WorkerConfig{Blocks: 2048, BlockSize: 16, MaxSeqs: 16, MaxBatchedTokens: 2048, Timing: sim.DefaultTiming()},
		}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != len(reqs) || res.RouteFailures != 0 || res.Refused != 0 || res.CallErrors != 0 {
			t.Fatalf("%s: %d requests, %d route failures (%s), %d refused, %d call errors", name, res.Requests, res.RouteFailures, res.RouteErr, res.Refused, res.CallErrors)
		}
		for i, d := range res.E2E {
			if d <= 0 {
				t.Fatalf("%s request %d: end-to-end %v", name, i, d)
			}
		}
	}
}

// TestBadInput: every kind of bad input is an error naming its line and column.
func TestBadInput(t *testing.T) {
	f := func(in string, line int, field, msg string) {
		t.Helper()
		_, err := convert(strings.NewReader(in), new(bytes.Buffer), options{BlockSize: 512})
		var re *tracecsv.RowError
		if !errors.As(err, &re) || !errors.Is(err, tracecsv.ErrBadInput) {
			t.Fatalf("%q: error %v, want a row error", in, err)
		}
		if re.Line != line || re.Field != field || !strings.Contains(err.Error(), msg) {
			t.Fatalf("%q: %v (line %d, field %q), want line %d, field %q, %q", in, err, re.Line, re.Field, line, field, msg)
		}
	}
	const h = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	f("", 0, "", "no header")
	f("2023-11-16 18:15:46.6805900,374,44\n", 1, "TIMESTAMP", "missing from the header")
	f("TIMESTAMP,ContextTokens\n", 1, "GeneratedTokens", "missing")
	f("TIMESTAMP,ContextTokens,ContextTokens,GeneratedTokens\n", 1, "ContextTokens", "twice")
	f(h+"2023-11-16 18:15:46.6805900,374\n", 2, "", "2 fields")
	f(h+"\n2023-11-16 18:15:46.6805900,374,44,1\n", 3, "", "4 fields")
	f(h+"16/11/2023 18:15:46,374,44\n", 2, "TIMESTAMP", "want a time")
	f(h+"1970-01-01 00:00:01,374,44\n", 2, "TIMESTAMP", "want a time from 1970-01-02")
	f(h+"2200-01-01 00:00:00,374,44\n", 2, "TIMESTAMP", "to the end of 2199")
	f(h+"2023-11-16 18:15:46.6805900,-1,44\n", 2, "ContextTokens", "want 0 to")
	f(h+"2023-11-16 18:15:46.6805900,374,4.5\n", 2, "GeneratedTokens", "whole number")
	f(h+"2023-11-16 18:15:46.6805900,99999999999,44\n", 2, "ContextTokens", "want 0 to")
	f(h+"2023-11-16 18:15:46.6805900,\"374,44\n", 2, "", "quotes only around")
	f(h+strings.Repeat("x", tracecsv.MaxLine+1)+"\n", 2, "", "longer than")
}

// TestForms: the header's columns in another order and case, quoted fields, a zone, a T, a
// byte-order mark, blank lines, and a row without context tokens.
func TestForms(t *testing.T) {
	in := "\ufeffgeneratedtokens,\"TIMESTAMP\",ContextTokens,NumImages\r\n\r\n" +
		"7,2024-05-10T00:00:00.0099300+00:00,\"1025\",0\r\n" +
		"3,2024-05-10 02:00:00.5Z,0,1\r\n" +
		"9,2024-05-10 00:00:01,1,0\r\n"
	var out bytes.Buffer
	st, err := convert(strings.NewReader(in), &out, options{BlockSize: 512})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"block_size":512,"time_unit":"ms"}
{"timestamp":1715299200009.93,"input_length":1025,"output_length":7,"hash_ids":[0,1,2]}
{"timestamp":1715299201000,"input_length":1,"output_length":9,"hash_ids":[3]}
`
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
	if st != (stats{Rows: 3, Written: 2, EmptyPrompts: 1}) {
		t.Fatalf("stats %+v", st)
	}
}

// FuzzConvert: any input converts or is refused with a row error, and what converts loads.
func FuzzConvert(f *testing.F) {
	for _, name := range []string{"conv_head.csv", "code_head.csv"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, 512)
	}
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10T00:00:00Z,0,1\n"), 1)
	f.Fuzz(func(t *testing.T, in []byte, blockSize int) {
		blockSize = 1 + abs(blockSize)%4096
		var out bytes.Buffer
		st, err := convert(bytes.NewReader(in), &out, options{BlockSize: blockSize})
		if err != nil {
			if !errors.Is(err, tracecsv.ErrBadInput) {
				t.Fatalf("error %v is not a row error", err)
			}
			return
		}
		rows, err := trace.ReadMooncakeRows(&out, trace.MooncakeOptions{})
		if err != nil {
			t.Fatalf("the output does not load: %v", err)
		}
		if len(rows) != st.Written {
			t.Fatalf("%d rows loaded, %d written", len(rows), st.Written)
		}
	})
}

func abs(v int) int {
	if v < 0 {
		return -(v + 1)
	}
	return v
}
