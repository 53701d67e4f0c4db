package tracecsv

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestWriter: the header line, then requests with hash ids from one running counter, and a
// session only where there is one.
func TestWriter(t *testing.T) {
	f := func(blockSize int, reqs [][2]int, sessions []string, want string) {
		t.Helper()
		var out bytes.Buffer
		w := NewWriter(&out, blockSize)
		if err := w.WriteHeader(); err != nil {
			t.Fatal(err)
		}
		for i, r := range reqs {
			if err := w.WriteRequest(fmt.Sprint(1000*i), r[0], r[1], sessions[i]); err != nil {
				t.Fatal(err)
			}
		}
		if out.String() != want {
			t.Fatalf("block size %d, %v:\n got %s\nwant %s", blockSize, reqs, out.String(), want)
		}
	}
	f(512, nil, nil, `{"block_size":512,"time_unit":"ms"}`+"\n")
	f(512, [][2]int{{472, 18}, {1087, 0}, {512, 1}, {513, 2}}, []string{"", "s-1", "", "s-1"}, `{"block_size":512,"time_unit":"ms"}
{"timestamp":0,"input_length":472,"output_length":18,"hash_ids":[0]}
{"timestamp":1000,"input_length":1087,"output_length":0,"hash_ids":[1,2,3],"session_id":"s-1"}
{"timestamp":2000,"input_length":512,"output_length":1,"hash_ids":[4]}
{"timestamp":3000,"input_length":513,"output_length":2,"hash_ids":[5,6],"session_id":"s-1"}
`)
	f(1, [][2]int{{3, 1}, {0, 1}, {1, 1}}, []string{"", "", ""}, `{"block_size":1,"time_unit":"ms"}
{"timestamp":0,"input_length":3,"output_length":1,"hash_ids":[0,1,2]}
{"timestamp":1000,"input_length":0,"output_length":1,"hash_ids":[]}
{"timestamp":2000,"input_length":1,"output_length":1,"hash_ids":[3]}
`)
}

// TestWriterLimits: a request of more than MaxIDs hash ids is refused and writes nothing; a
// write error comes back.
func TestWriterLimits(t *testing.T) {
	var out bytes.Buffer
	w := NewWriter(&out, 1)
	if err := w.CheckInput(MaxIDs); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d tokens make %d hash ids of 1 tokens, over %d: give a larger --block-size", MaxIDs+1, MaxIDs+1, MaxIDs)
	if err := w.CheckInput(MaxIDs + 1); err == nil || err.Error() != want {
		t.Fatalf("CheckInput: %v, want %s", err, want)
	}
	if err := w.WriteRequest("0", MaxIDs+1, 1, ""); err == nil || err.Error() != want || out.Len() != 0 {
		t.Fatalf("WriteRequest: %v, %d bytes written", err, out.Len())
	}
	w = NewWriter(failWriter{}, 512)
	if err := w.WriteHeader(); err == nil || err.Error() != "full" {
		t.Fatalf("WriteHeader: %v", err)
	}
	if err := w.WriteRequest("0", 1, 1, ""); err == nil || err.Error() != "full" {
		t.Fatalf("WriteRequest: %v", err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("full") }

// TestWriteRequestAllocs: writing a request reuses the Writer's buffer.
func TestWriteRequestAllocs(t *testing.T) {
	var out bytes.Buffer
	w := NewWriter(&out, 16)
	if n := testing.AllocsPerRun(100, func() {
		out.Reset()
		if err := w.WriteRequest("1700158546680.59", 4808, 10, "3f1c9a2e-0001"); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations a request", n)
	}
}

// TestConvert: rows go from a Reader through the caller's row function to a Writer; the
// header is written once the CSV's is read, and the first error stops the conversion.
func TestConvert(t *testing.T) {
	f := func(in, want, wantErr string) {
		t.Helper()
		var out bytes.Buffer
		r := NewReader(strings.NewReader(in), "test", azure)
		w := NewWriter(&out, 2)
		err := Convert(r, w, func() error {
			in, err := ParseTokens(r.Field(1))
			if err != nil {
				return r.FieldError(1, err)
			}
			out, err := ParseTokens(r.Field(2))
			if err != nil {
				return r.FieldError(2, err)
			}
			return w.WriteRequest(r.Field(0), in, out, "")
		})
		if got := fmt.Sprint(err); out.String() != want || got != wantErr {
			t.Fatalf("%q:\n got %s, %s\nwant %s, %s", in, out.String(), got, want, wantErr)
		}
	}
	const h = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	const oh = `{"block_size":2,"time_unit":"ms"}` + "\n"
	f("", "", "test: line 0: no header row: want TIMESTAMP,ContextTokens,GeneratedTokens")
	f(h, oh, "<nil>")
	f(h+"5,3,1\n6.5,4,2\n", oh+`{"timestamp":5,"input_length":3,"output_length":1,"hash_ids":[0,1]}
{"timestamp":6.5,"input_length":4,"output_length":2,"hash_ids":[2,3]}
`, "<nil>")
	f(h+"5,3,1\n6,-1,2\n7,1,1\n", oh+`{"timestamp":5,"input_length":3,"output_length":1,"hash_ids":[0,1]}
`, "test: line 3: field ContextTokens: -1: want 0 to 16777216 tokens")
	f(h+"5,3,x\n", oh, `test: line 2: field GeneratedTokens: "x": want a whole number of tokens`)
	f(h+"5,3\n", oh, "test: line 2: 2 fields, but the header has 3")
}
