package main

import (
	"strings"
	"testing"
)

// TestFilter: go test -json's events come out as go test prints them without -v — package
// lines and a failing test's output, not a passing test's — and each skip is kept with its
// reason, the file:line prefix dropped.
func TestFilter(t *testing.T) {
	const in = `{"Action":"start","Package":"m/a"}
{"Action":"run","Package":"m/a","Test":"TestOK"}
{"Action":"output","Package":"m/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"m/a","Test":"TestOK","Output":"    a_test.go:9: chatter\n"}
{"Action":"output","Package":"m/a","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"m/a","Test":"TestOK"}
{"Action":"run","Package":"m/a","Test":"TestNATS"}
{"Action":"output","Package":"m/a","Test":"TestNATS","Output":"=== RUN   TestNATS\n"}
{"Action":"output","Package":"m/a","Test":"TestNATS","Output":"    extbin.go:31: nats-server is not installed (Debian: apt-get install nats-server)\n"}
{"Action":"output","Package":"m/a","Test":"TestNATS","Output":"--- SKIP: TestNATS (0.00s)\n"}
{"Action":"skip","Package":"m/a","Test":"TestNATS"}
{"Action":"run","Package":"m/a","Test":"TestBad"}
{"Action":"output","Package":"m/a","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"output","Package":"m/a","Test":"TestBad","Output":"    a_test.go:20: got 1, want 2\n"}
{"Action":"output","Package":"m/a","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"m/a","Test":"TestBad"}
{"Action":"run","Package":"m/a","Test":"TestHang"}
{"Action":"output","Package":"m/a","Test":"TestHang","Output":"panic: boom\n"}
{"Action":"output","Package":"m/a","Output":"FAIL\n"}
{"Action":"output","Package":"m/a","Output":"FAIL\tm/a\t0.01s\n"}
{"Action":"fail","Package":"m/a"}
{"Action":"output","Package":"m/b","Output":"PASS\n"}
{"Action":"output","Package":"m/b","Output":"ok  \tm/b\t0.01s\n"}
{"Action":"pass","Package":"m/b"}
{"ImportPath":"m/c","Action":"build-output","Output":"c/c.go:3:1: syntax error\n"}
go: downloading example.com/x v1.0.0
`
	var out strings.Builder
	f := newFilter(&out, "-race")
	if err := f.copy(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	want := "    a_test.go:20: got 1, want 2\n--- FAIL: TestBad (0.00s)\npanic: boom\nFAIL\nFAIL\tm/a\t0.01s\nok  \tm/b\t0.01s\n" +
		"c/c.go:3:1: syntax error\ngo: downloading example.com/x v1.0.0\n"
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
	if len(f.skipped) != 1 || f.skipped[0] != (record{"-race", "m/a", "TestNATS", "nats-server is not installed (Debian: apt-get install nats-server)"}) {
		t.Errorf("skipped: %+v", f.skipped)
	}
}

// TestSummary: one line per reason, with its tests; the passes named only when a test did not
// skip in all.
func TestSummary(t *testing.T) {
	f := func(records, want string) {
		t.Helper()
		var out strings.Builder
		writeSummary(&out, parseRecords(records))
		if out.String() != want {
			t.Errorf("summary of %q:\n%s\nwant:\n%s", records, out.String(), want)
		}
	}
	f("", "no test skipped\n")
	f("plain\tgithub.com/kvrouterd/kvrouterd/ui\tTestPageInChromium\tchromium is not installed\n"+
		"-race\tgithub.com/kvrouterd/kvrouterd/ui\tTestPageInChromium\tchromium is not installed\n"+
		"-race\tgithub.com/kvrouterd/kvrouterd/router\tTestAllocs\tno allocation counts under -race\n"+
		"-race\tgithub.com/kvrouterd/kvrouterd/radix\tTestAllocs\tno allocation counts under -race\n",
		"3 tests skipped (go test -v -run NAME ./PACKAGE shows one):\n"+
			"  radix TestAllocs, router TestAllocs: [-race] no allocation counts under -race\n"+
			"  ui TestPageInChromium: chromium is not installed\n")
}

func TestPassLabel(t *testing.T) {
	f := func(args, want string) {
		t.Helper()
		if got := passLabel(strings.Fields(args)); got != want {
			t.Errorf("passLabel(%q) = %q, want %q", args, got, want)
		}
	}
	f("-count=1 ./...", "plain")
	f("-race -count=1 ./...", "-race")
	f("-count=1 -tags invariants ./...", "-tags invariants")
}
