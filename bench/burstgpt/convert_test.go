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

const sample = "burstgpt1_head.csv"

type outRow struct {
	Timestamp    float64  `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
	SessionID    string   `json:"session_id"`
}

// convertString converts in and returns the output, its rows (header excluded) and the counts.
func convertString(t *testing.T, in string, opt options) ([]byte, []outRow, stats) {
	t.Helper()
	var out bytes.Buffer
	st, err := convert(strings.NewReader(in), &out, opt)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if want := `{"block_size":` + strconv.Itoa(opt.BlockSize) + `,"time_unit":"ms"}`; lines[0] != want {
		t.Fatalf("header %s, want %s", lines[0], want)
	}
	rows := make([]outRow, len(lines)-1)
	for i, l := range lines[1:] {
		if err := json.Unmarshal([]byte(l), &rows[i]); err != nil {
			t.Fatalf("output line %d: %v: %s", i+2, err, l)
		}
	}
	if st.Written != len(rows) || st.Rows != st.Written+st.Failures+st.EmptyPrompts+st.Filtered {
		t.Fatalf("stats %+v for %d rows written", st, len(rows))
	}
	return out.Bytes(), rows, st
}

func readSample(t testing.TB) string {
	b, err := os.ReadFile(filepath.Join("testdata", sample))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func ids(from uint64, n int) []uint64 {
	v := make([]uint64, n)
	for i := range v {
		v[i] = from + uint64(i)
	}
	return v
}

// TestSample: real rows of BurstGPT_1, with values checked by hand against the CSV.
func TestSample(t *testing.T) {
	in := readSample(t)
	f := func(opt options, rows int, want stats, row int, wantRow outRow) {
		t.Helper()
		_, got, st := convertString(t, in, opt)
		if len(got) != rows || st != want {
			t.Fatalf("%+v: %d rows, stats %+v; want %d, %+v", opt, len(got), st, rows, want)
		}
		if row < 0 {
			return
		}
		if g := got[row]; g.Timestamp != wantRow.Timestamp || g.InputLength != wantRow.InputLength || g.OutputLength != wantRow.OutputLength || !slices.Equal(g.HashIDs, wantRow.HashIDs) || g.SessionID != "" {
			t.Errorf("%+v row %d:\n got %+v\nwant %+v", opt, row+1, g, wantRow)
		}
	}
	// 30 rows, one failed (1106 s: 0 request and 0 response tokens).
	all := stats{Rows: 30, Written: 29, Failures: 1}
	f(options{BlockSize: 512}, 29, all, 0, outRow{Timestamp: 5000, InputLength: 472, OutputLength: 18, HashIDs: ids(0, 1)})
	f(options{BlockSize: 512}, 29, all, 1, outRow{Timestamp: 45000, InputLength: 1087, OutputLength: 230, HashIDs: ids(1, 3)})
	// 185 s, 1360 tokens: three blocks after the 1 + 3 + 1 of the rows before.
	f(options{BlockSize: 512}, 29, all, 3, outRow{Timestamp: 185000, InputLength: 1360, OutputLength: 647, HashIDs: ids(5, 3)})
	f(options{BlockSize: 512}, 29, all, 28, outRow{Timestamp: 2293000, InputLength: 507, OutputLength: 448, HashIDs: ids(50, 1)})
	// 472 tokens are 30 blocks of 16 (29.5).
	f(options{BlockSize: 16}, 29, all, 0, outRow{Timestamp: 5000, InputLength: 472, OutputLength: 18, HashIDs: ids(0, 30)})
	// Kept, the failed row still has no prompt.
	f(options{BlockSize: 512, KeepFailures: true}, 29, stats{Rows: 30, Written: 29, EmptyPrompts: 1}, 20, outRow{Timestamp: 1129000, InputLength: 1305, OutputLength: 477, HashIDs: ids(33, 3)})
	// Seven GPT-4 rows; the first at 118 s, 417 tokens.
	f(options{BlockSize: 512, Model: "GPT-4"}, 7, stats{Rows: 30, Written: 7, Filtered: 23}, 0, outRow{Timestamp: 118000, InputLength: 417, OutputLength: 276, HashIDs: ids(0, 1)})
	f(options{BlockSize: 512, LogType: "API log"}, 0, stats{Rows: 30, Filtered: 30}, -1, outRow{})
}

// TestLoadAndReplay: the output loads with bench/trace at its own block size, keeps the
// trace's intervals, shares no prefix, and replays on a small simulated fleet.
func TestLoadAndReplay(t *testing.T) {
	out, rows, _ := convertString(t, readSample(t), options{BlockSize: 64})
	path := filepath.Join(t.TempDir(), "out.jsonl")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	reqs, err := trace.LoadMooncake(path, trace.MooncakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != len(rows) {
		t.Fatalf("loaded %d requests of %d rows", len(reqs), len(rows))
	}
	for i, r := range reqs {
		want := time.Duration(rows[i].Timestamp) * time.Millisecond
		if r.At != want || len(r.Tokens) != rows[i].InputLength || r.Output != rows[i].OutputLength || r.Session != 0 {
			t.Fatalf("request %d: at %v, %d tokens, output %d, session %d; want %v, %+v", i, r.At, len(r.Tokens), r.Output, r.Session, want, rows[i])
		}
	}
	if reqs[28].At != 2293*time.Second {
		t.Errorf("last request at %v, want 2293s", reqs[28].At)
	}
	if h := trace.CountHits(reqs, 16); h.Hits != 0 {
		t.Errorf("%d prefix hits, want none: the trace has no prompt content", h.Hits)
	}
	// 38 minutes of trace at about one request a minute: scaled down, so that requests overlap.
	res, err := fleet.Run(fleet.Config{
		Workers: 2, Mode: scoring.KV, Seed: 1,
		Worker: sim.WorkerConfig{Blocks: 2048, BlockSize: 16, MaxSeqs: 16, MaxBatchedTokens: 2048, Timing: sim.DefaultTiming()},
	}, trace.Scale(reqs, 0.01))
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != len(reqs) || res.RouteFailures != 0 || res.Refused != 0 || res.CallErrors != 0 {
		t.Fatalf("%d requests, %d route failures (%s), %d refused, %d call errors", res.Requests, res.RouteFailures, res.RouteErr, res.Refused, res.CallErrors)
	}
	for i, d := range res.E2E {
		if d <= 0 {
			t.Fatalf("request %d: end-to-end %v", i, d)
		}
	}
}

// TestSessions: BurstGPT_3's Session ID column (these rows are made up, in its layout) becomes
// session_id, written only on rows that have one, and each turn still gets its own hash ids.
func TestSessions(t *testing.T) {
	in := "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\r\n" +
		"10.5,3f1c9a2e-0001,2.1,ChatGPT,600,100,700,Conversation log\r\n" +
		"12,,0.9,GPT-4,30,20,50,API log\r\n" +
		"40.0625,3f1c9a2e-0001,3.0,ChatGPT,800,50,850,Conversation log\r\n"
	out, rows, _ := convertString(t, in, options{BlockSize: 512})
	want := []outRow{
		{Timestamp: 10500, InputLength: 600, OutputLength: 100, HashIDs: ids(0, 2), SessionID: "3f1c9a2e-0001"},
		{Timestamp: 12000, InputLength: 30, OutputLength: 20, HashIDs: ids(2, 1)},
		{Timestamp: 40062.5, InputLength: 800, OutputLength: 50, HashIDs: ids(3, 2), SessionID: "3f1c9a2e-0001"},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows", len(rows))
	}
	for i := range want {
		if g := rows[i]; g.Timestamp != want[i].Timestamp || g.InputLength != want[i].InputLength || g.OutputLength != want[i].OutputLength || !slices.Equal(g.HashIDs, want[i].HashIDs) || g.SessionID != want[i].SessionID {
			t.Errorf("row %d: got %+v, want %+v", i+1, g, want[i])
		}
	}
	reqs, err := trace.ReadMooncake(bytes.NewReader(out), trace.MooncakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if reqs[0].Session == 0 || reqs[0].Session != reqs[2].Session || reqs[1].Session != 0 {
		t.Fatalf("sessions %d, %d, %d", reqs[0].Session, reqs[1].Session, reqs[2].Session)
	}
	if reqs[2].At != 40062500*time.Microsecond {
		t.Fatalf("third request at %v", reqs[2].At)
	}
	res, err := fleet.Run(fleet.Config{
		Workers: 2, Mode: scoring.KV, Seed: 1, ClosedLoop: true,
		Worker: sim.WorkerConfig{Blocks: 2048, BlockSize: 16, MaxSeqs: 16, MaxBatchedTokens: 2048, Timing: sim.DefaultTiming()},
	}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 3 || res.LaterTurns != 1 || res.RouteFailures != 0 {
		t.Fatalf("%d requests, %d later turns, %d route failures", res.Requests, res.LaterTurns, res.RouteFailures)
	}
}

func TestSecondsToMillis(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		got, err := secondsToMillis(in)
		if err != nil || got != want {
			t.Fatalf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
	f("5", "5000")
	f("0", "0")
	f("007", "7000")
	f("5.25", "5250")
	f("5.0", "5000")
	f("0.0001", "0.1")
	f("10454395.123456789", "10454395123.456789")
	f("3999999999.999", "3999999999999")
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
	const h = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
	f("", 0, "", "no header")
	f("5,ChatGPT,472,18,490,Conversation log\n", 1, "Timestamp", "missing from the header")
	f("Timestamp,Model,Request tokens\n", 1, "Response tokens", "missing")
	f("Timestamp,Request tokens,Response tokens,request_tokens\n", 1, "Request tokens", "twice")
	f(h+"5,ChatGPT,472,18,490\n", 2, "", "5 fields")
	f(h+"\n5,ChatGPT,472,18,490,Conversation log,x\n", 3, "", "7 fields")
	for _, ts := range []string{"", "-5", "5.", ".5", "5e3", "1,5", "0x10", "5.1234567890", "99999999999", "4000000000"} {
		if ts == "1,5" {
			continue // a comma makes another field
		}
		f(h+ts+",ChatGPT,472,18,490,Conversation log\n", 2, "Timestamp", "")
	}
	f(h+"5,ChatGPT,-1,18,490,Conversation log\n", 2, "Request tokens", "want 0 to")
	f(h+"5,ChatGPT,472,18.0,490,Conversation log\n", 2, "Response tokens", "whole number")
	f(h+"5,ChatGPT,99999999999,18,490,Conversation log\n", 2, "Request tokens", "want 0 to")
	f(h+"5,ChatGPT,\"472,18,490,Conversation log\n", 2, "", "quotes only around")
	f(h+strings.Repeat("x", tracecsv.MaxLine+1)+"\n", 2, "", "longer than")
	const hs = "Timestamp,Session ID,Request tokens,Response tokens\n"
	f(hs+"5,a b,472,18\n", 2, "Session ID", "printable ASCII")
	f(hs+"5,a\\b,472,18\n", 2, "Session ID", "printable ASCII")
	f(hs+"5,"+strings.Repeat("a", maxSession+1)+",472,18\n", 2, "Session ID", "at most")
}

// FuzzConvert: any input converts or is refused with a row error, and what converts loads.
func FuzzConvert(f *testing.F) {
	f.Add([]byte(readSample(f)), 512, false)
	f.Add([]byte("Timestamp,Session ID,Request tokens,Response tokens\n5.5,s1,10,0\n6,s1,20,1\n"), 1, true)
	f.Fuzz(func(t *testing.T, in []byte, blockSize int, keep bool) {
		blockSize = 1 + abs(blockSize)%4096
		var out bytes.Buffer
		st, err := convert(bytes.NewReader(in), &out, options{BlockSize: blockSize, KeepFailures: keep})
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
