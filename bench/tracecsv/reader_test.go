package tracecsv

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// azure and burst are the columns of the two converters' traces, as they read them.
var (
	azure = Columns{
		Names:    []string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"},
		Required: 3,
		Example:  "TIMESTAMP,ContextTokens,GeneratedTokens",
		Want:     "TIMESTAMP,ContextTokens,GeneratedTokens",
	}
	burst = Columns{
		Names:    []string{"Timestamp", "Request tokens", "Response tokens", "Session ID"},
		Required: 3,
		Match: func(name, want string) bool {
			key := strings.NewReplacer(" ", "", "_", "")
			return strings.EqualFold(key.Replace(name), key.Replace(want))
		},
		Example: "Timestamp,Request tokens,Response tokens",
		Want:    "Timestamp, Request tokens and Response tokens",
	}
)

// readAll reads every row of in, each as its columns joined by "|".
func readAll(in string, cols Columns) ([]string, error) {
	r := NewReader(strings.NewReader(in), "test", cols)
	var rows []string
	for r.Next() {
		f := make([]string, len(cols.Names))
		for i := range f {
			f[i] = r.Field(i)
		}
		rows = append(rows, strings.Join(f, "|"))
	}
	return rows, r.Err()
}

// TestReader: the forms of CSV the traces come in, each read to the same fields.
func TestReader(t *testing.T) {
	f := func(in string, cols Columns, want ...string) {
		t.Helper()
		got, err := readAll(in, cols)
		if err != nil || strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("%q:\n got %q, %v\nwant %q", in, got, err, want)
		}
	}
	// Real rows: the head of Azure's 2023 conversation trace and of BurstGPT_1.
	f("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,374,44\r\n2023-11-16 18:15:50.9951690,396,109\r\n", azure,
		"2023-11-16 18:15:46.6805900|374|44", "2023-11-16 18:15:50.9951690|396|109")
	f("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n", burst,
		"5|472|18|")
	f("TIMESTAMP,ContextTokens,GeneratedTokens", azure)
	// Another order and case, quotes, a byte-order mark, blank lines, spaces, no final newline.
	f("\ufeffgeneratedtokens, \"TIMESTAMP\" ,ContextTokens,NumImages\r\n\r\n  \n7,\"2024-05-10\",\"\",0\n8, x ,9,1", azure,
		"2024-05-10||7", "x|9|8")
	// Loose names, an optional column present and absent.
	f("timestamp,session_id,request_tokens,ResponseTokens\n1,s,2,3\n", burst, "1|2|3|s")
	f("Timestamp,Request tokens,Response tokens\n1,2,3\n", burst, "1|2|3|")
	// A line of MaxLine bytes, its end included, is still a line.
	f("TIMESTAMP,ContextTokens,GeneratedTokens\n"+strings.Repeat(" ", MaxLine-6)+"a,b,c\n", azure, "a|b|c")
}

// TestReaderErrors: every kind of bad input is a *RowError naming its line and column, with the
// caller's prefix.
func TestReaderErrors(t *testing.T) {
	f := func(in string, cols Columns, line int, field, msg string) {
		t.Helper()
		_, err := readAll(in, cols)
		var re *RowError
		if !errors.As(err, &re) || !errors.Is(err, ErrBadInput) {
			t.Fatalf("%q: error %v, want a row error", in, err)
		}
		if re.Line != line || re.Field != field || err.Error() != msg {
			t.Fatalf("%q: %q (line %d, field %q), want line %d, field %q, %q", in, err, re.Line, re.Field, line, field, msg)
		}
	}
	const h = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	f("", azure, 0, "", "test: line 0: no header row: want TIMESTAMP,ContextTokens,GeneratedTokens")
	f("\n\r\n", burst, 2, "", "test: line 2: no header row: want Timestamp,Request tokens,Response tokens")
	f("1,2,3\n", azure, 1, "TIMESTAMP", `test: line 1: field TIMESTAMP: missing from the header "1,2,3": want TIMESTAMP,ContextTokens,GeneratedTokens`)
	f("Timestamp,Request tokens\n", burst, 1, "Response tokens", `test: line 1: field Response tokens: missing from the header "Timestamp,Request tokens": want Timestamp, Request tokens and Response tokens`)
	f("Timestamp,Request tokens,Response tokens,request_tokens\n", burst, 1, "Request tokens", "test: line 1: field Request tokens: appears twice in the header")
	f(h+"1,2\n", azure, 2, "", "test: line 2: 2 fields, but the header has 3")
	f(h+"\n1,2,3,4\n", azure, 3, "", "test: line 3: 4 fields, but the header has 3")
	f(h+"1,\"2,3\n", azure, 2, "", `test: line 2: field 2: "\"2": quotes only around a whole field`)
	f(h+"1,2\"\",3\n", azure, 2, "", `test: line 2: field 2: "2\"\"": quotes only around a whole field`)
	f(h+"1,\"2\"3\",4\n", azure, 2, "", `test: line 2: field 2: "\"2\"3\"": quotes only around a whole field`)
	f("TIMESTAMP,\"ContextTokens,GeneratedTokens\n", azure, 1, "", `test: line 1: field 2: "\"ContextTokens": quotes only around a whole field`)
	f(h+strings.Repeat("x", MaxLine)+"\n", azure, 2, "", fmt.Sprintf("test: line 2: longer than %d bytes: not a row of this format", MaxLine))
	f(strings.Repeat("x", MaxLine+1), azure, 1, "", fmt.Sprintf("test: line 1: longer than %d bytes: not a row of this format", MaxLine))

	// A read error is not a row error: it names the line after which it came.
	r := NewReader(errReader{strings.NewReader(h + "1,2,3\n")}, "test", azure)
	for r.Next() {
	}
	if err := r.Err(); err == nil || errors.Is(err, ErrBadInput) || err.Error() != "test: after line 2: disk on fire" {
		t.Fatalf("read error: %v", err)
	}
	// An error from the caller's row names the column, by its name.
	r = NewReader(strings.NewReader(h+"1,2,3\n"), "", azure)
	if !r.Next() {
		t.Fatal(r.Err())
	}
	if err := r.FieldError(1, errors.New("no")); err.Error() != "line 2: field ContextTokens: no" || !errors.Is(err, ErrBadInput) {
		t.Fatalf("field error: %v", err)
	}
}

// errReader returns its reader's bytes, then an error.
type errReader struct{ r *strings.Reader }

func (e errReader) Read(p []byte) (int, error) {
	if e.r.Len() == 0 {
		return 0, errors.New("disk on fire")
	}
	return e.r.Read(p)
}

// FuzzReader: any input is read to its end or refused with a *RowError; never a panic, and
// no field read holds a quote or a comma.
func FuzzReader(f *testing.F) {
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,374,44\r\n2023-11-16 18:15:50.9951690,396,109\r\n"), false)
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,4808,10\r\n"), false)
	f.Add([]byte("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,230,1317,Conversation log\n"), true)
	f.Add([]byte("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\r\n10.5,3f1c9a2e-0001,2.1,ChatGPT,600,100,700,Conversation log\r\n"), true)
	f.Add([]byte("\ufeffgeneratedtokens,\"TIMESTAMP\",ContextTokens\r\n\r\n7,\"x\",\"\"\n"), false)
	f.Fuzz(func(t *testing.T, in []byte, loose bool) {
		cols := azure
		if loose {
			cols = burst
		}
		r := NewReader(bytes.NewReader(in), "fuzz", cols)
		for r.Next() {
			for i := range cols.Names {
				v := r.Field(i)
				if strings.ContainsAny(v, "\",") {
					t.Fatalf("column %d: %q", i, v)
				}
			}
		}
		if err := r.Err(); err != nil && !errors.Is(err, ErrBadInput) {
			t.Fatalf("error %v is not a row error", err)
		}
	})
}
