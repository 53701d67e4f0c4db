package replica_test

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/replica"
)

var (
	dumpLine = regexp.MustCompile(`^([0-9a-f]{4})  ([0-9a-f]{2}(?: [0-9a-f]{2})*)$`)
	// A row of a worked example's table: offset, bytes, field.
	exampleRow = regexp.MustCompile("^\\| +([0-9]+) +\\| `([0-9a-f ]+)` +\\| ([a-z_]+)(\\[[0-9]+\\])? +\\|")
	errField   = regexp.MustCompile(`field "([a-z_]+)" at offset ([0-9]+)`)
)

// workedExample is a message of SPEC.md's worked example as the document shows it: the bytes of
// its hex dump and the rows of the table below the dump.
type workedExample struct {
	bytes []byte
	rows  []exampleField
}

type exampleField struct {
	offset int
	bytes  []byte
	field  string // as the decoder names it: block_hashes for block_hashes[1]
}

// readSpec returns SPEC.md and its worked examples, in the order the document gives them.
func readSpec(t *testing.T) (string, []workedExample) {
	t.Helper()
	b, err := os.ReadFile("SPEC.md")
	if err != nil {
		t.Fatal(err)
	}
	var (
		out    []workedExample
		code   []string
		inCode bool
	)
	for n, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			if inCode && len(code) > 0 && dumpLine.MatchString(code[0]) {
				var ex workedExample
				for i, l := range code {
					m := dumpLine.FindStringSubmatch(l)
					if m == nil || m[1] != fmt.Sprintf("%04x", 16*i) {
						t.Fatalf("SPEC.md:%d: hex dump line %q", n+1, l)
					}
					ex.bytes = append(ex.bytes, hexBytes(t, m[2])...)
				}
				out = append(out, ex)
			}
			inCode, code = !inCode, code[:0]
		case inCode:
			code = append(code, line)
		default:
			m := exampleRow.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			if len(out) == 0 {
				t.Fatalf("SPEC.md:%d: a worked example's row before any hex dump", n+1)
			}
			off, _ := strconv.Atoi(m[1])
			ex := &out[len(out)-1]
			ex.rows = append(ex.rows, exampleField{offset: off, bytes: hexBytes(t, m[2]), field: m[3]})
		}
	}
	return string(b), out
}

func hexBytes(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return b
}

// TestSpecWorkedExample holds SPEC.md's worked example to the code: the hex dumps are what
// Append writes for the booking and the completion; each table below a dump covers its message
// byte for byte, in order, with the bytes the dump has; and every field the decoder names, for
// a message cut short anywhere, is a row of the table at the offset the decoder reports.
func TestSpecWorkedExample(t *testing.T) {
	spec, examples := readSpec(t)
	want := [][]byte{replica.Append(nil, specBooking()), replica.Append(nil, specCompletion())}
	if len(examples) != len(want) {
		t.Fatalf("SPEC.md has %d hex dumps, want the booking's and the completion's", len(examples))
	}
	for i, ex := range examples {
		if !slices.Equal(ex.bytes, want[i]) {
			t.Fatalf("SPEC.md's hex dump %d:\n%x\nthe encoder writes\n%x", i+1, ex.bytes, want[i])
		}
		at := 0
		for _, r := range ex.rows {
			if r.offset != at {
				t.Fatalf("example %d: row %q at offset %d, want %d (the end of the row before)", i+1, r.field, r.offset, at)
			}
			if got := ex.bytes[at:min(at+len(r.bytes), len(ex.bytes))]; !slices.Equal(got, r.bytes) {
				t.Fatalf("example %d: row %q at offset %d: % x, the message has % x", i+1, r.field, at, r.bytes, got)
			}
			at += len(r.bytes)
		}
		if at != len(ex.bytes) {
			t.Fatalf("example %d: the table ends at offset %d, the message at %d", i+1, at, len(ex.bytes))
		}
		var m replica.Msg
		for n := range len(ex.bytes) {
			err := replica.Decode(ex.bytes[:n], &m)
			f := errField.FindStringSubmatch(errString(err))
			if f == nil {
				t.Fatalf("example %d cut to %d bytes: %v", i+1, n, err)
			}
			off, _ := strconv.Atoi(f[2])
			if !slices.ContainsFunc(ex.rows, func(r exampleField) bool { return r.field == f[1] && r.offset == off }) {
				t.Fatalf("example %d cut to %d bytes: the decoder reports field %q at offset %d, which the table does not have", i+1, n, f[1], off)
			}
			if !strings.Contains(spec, "`"+f[1]+"`") {
				t.Fatalf("field %q is not in SPEC.md's layout", f[1])
			}
		}
	}

	// The malformed messages of the example, and the errors quoted in section 5.
	bad := slices.Clone(want[0])
	copy(bad[47:], []byte{0, 0, 0, 0})
	var m replica.Msg
	for _, err := range []error{replica.Decode(bad, &m), replica.Decode(want[1][:18], &m)} {
		if !errors.Is(err, replica.ErrMsg) || !strings.Contains(spec, "\n"+err.Error()+"\n") {
			t.Fatalf("SPEC.md does not quote the error %q", err)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestSpecSizes: the sizes SPEC.md gives for a typical booking and completion.
func TestSpecSizes(t *testing.T) {
	spec, _ := readSpec(t)
	booked := &replica.Msg{Op: replica.OpBooked, Replica: strings.Repeat("r", 16), ID: strings.Repeat("i", 36),
		Model: strings.Repeat("m", 30), TTL: 1, Seqs: make([]uint64, 128)}
	done := &replica.Msg{Op: replica.OpCompleted, Replica: booked.Replica, ID: booked.ID}
	n, k := len(replica.Append(nil, booked)), len(replica.Append(nil, done))
	if n != 39+16+36+30+8*128 || k != 9+16+36 {
		t.Fatalf("a booking of 128 blocks is %d bytes, a completion %d: not what section 3's formulas give", n, k)
	}
	for _, s := range []string{"is 1,145 bytes", "61 bytes each", "39+*R*+*L*+*M*+8*n* bytes", "9+*R*+*L* bytes"} {
		if !strings.Contains(spec, s) {
			t.Errorf("SPEC.md does not say %q", s)
		}
	}
	if n != 1145 || k != 61 {
		t.Fatalf("sizes %d and %d, SPEC.md says 1,145 and 61", n, k)
	}
}
