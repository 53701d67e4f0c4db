package tracecsv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
)

// MaxLine is the longest CSV line a Reader takes, in bytes, its line end included: a trace row
// is some tens of bytes, so a longer line is not a trace of this kind, and refusing it bounds
// memory.
const MaxLine = 64 << 10

// ErrBadInput is wrapped by every error about the input's content.
var ErrBadInput = errors.New("tracecsv: bad input")

// RowError says which line of the input, and which column of it, was wrong. It is plain data.
type RowError struct {
	Prog  string // the command whose input it is, the message's prefix; empty: none
	Line  int    // 1-based
	Field string // the column's name; empty when the line as a whole is wrong
	Err   error
}

func (e *RowError) Error() string {
	prefix := ""
	if e.Prog != "" {
		prefix = e.Prog + ": "
	}
	if e.Field == "" {
		return fmt.Sprintf("%sline %d: %v", prefix, e.Line, e.Err)
	}
	return fmt.Sprintf("%sline %d: field %s: %v", prefix, e.Line, e.Field, e.Err)
}

func (e *RowError) Unwrap() []error { return []error{ErrBadInput, e.Err} }

// Columns says which columns of a trace a Reader finds in the header. It is plain data, read
// only.
type Columns struct {
	// Names are the columns read, as the header names them; a Reader's column i is Names[i].
	Names []string
	// Required is how many of Names, from the first, the header must have; the others are
	// read where present.
	Required int
	// Match says whether a header's name is column want; nil: strings.EqualFold.
	Match func(name, want string) bool
	// Example is a header line, shown when the input has none; Want names the required
	// columns, shown when one is missing.
	Example, Want string
}

// Reader reads a CSV trace's header and then its rows, one line at a time. It is owned by one
// goroutine.
type Reader struct {
	prog   string
	cols   Columns
	sc     *bufio.Scanner
	line   int   // the last line read, 1-based
	index  []int // each column's index in a row, -1 if absent
	fields int   // columns in the header; -1 before it is read
	row    []string
	err    error
}

// NewReader returns a Reader of r that finds cols and prefixes its errors with prog.
func NewReader(r io.Reader, prog string, cols Columns) *Reader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4<<10), MaxLine)
	return &Reader{prog: prog, cols: cols, sc: sc, index: make([]int, len(cols.Names)), fields: -1}
}

// next returns the next line that is not blank, trimmed, or nil at the end or on an error,
// which it keeps in r.err.
func (r *Reader) next() []byte {
	for r.sc.Scan() {
		r.line++
		b := r.sc.Bytes()
		if r.line == 1 {
			b = bytes.TrimPrefix(b, []byte("\ufeff"))
		}
		if b = bytes.TrimSpace(b); len(b) > 0 { // CRLF too
			return b
		}
	}
	if err := r.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			r.err = &RowError{Prog: r.prog, Line: r.line + 1, Err: fmt.Errorf("longer than %d bytes: not a row of this format", MaxLine)}
		} else {
			r.err = fmt.Errorf("%s: after line %d: %w", r.prog, r.line, err)
		}
	}
	return nil
}

// ReadHeader reads the header line and finds the columns in it. Next calls it when it has not
// been called.
func (r *Reader) ReadHeader() error {
	if r.err != nil || r.fields >= 0 {
		return r.err
	}
	b := r.next()
	if b == nil {
		if r.err == nil {
			r.err = &RowError{Prog: r.prog, Line: r.line, Err: errors.New("no header row: want " + r.cols.Example)}
		}
		return r.err
	}
	r.err = r.header(b)
	return r.err
}

func (r *Reader) header(b []byte) error {
	names, err := r.split(b)
	if err != nil {
		return err
	}
	match := r.cols.Match
	if match == nil {
		match = strings.EqualFold
	}
	for i := range r.index {
		r.index[i] = -1
	}
	for j, name := range names {
		for i, want := range r.cols.Names {
			if match(name, want) {
				if r.index[i] >= 0 {
					return &RowError{Prog: r.prog, Line: r.line, Field: want, Err: errors.New("appears twice in the header")}
				}
				r.index[i] = j
			}
		}
	}
	for i, want := range r.cols.Names[:r.cols.Required] {
		if r.index[i] < 0 {
			return &RowError{Prog: r.prog, Line: r.line, Field: want, Err: fmt.Errorf("missing from the header %q: want %s", b, r.cols.Want)}
		}
	}
	r.fields = len(names)
	return nil
}

// Next reads the next row, reading the header first if need be. It returns false at the end of
// the input or on an error, which Err returns.
func (r *Reader) Next() bool {
	if r.ReadHeader() != nil {
		return false
	}
	b := r.next()
	if b == nil {
		return false
	}
	f, err := r.split(b)
	if err == nil && len(f) != r.fields {
		err = r.lineError(fmt.Errorf("%d fields, but the header has %d", len(f), r.fields))
	}
	r.err = err
	return err == nil
}

// Err returns the error that ended ReadHeader or Next, or nil at the end of the input.
func (r *Reader) Err() error { return r.err }

// Field returns column i of the current row, "" when the header has no such column. The
// string is a copy: it stays valid after Next.
func (r *Reader) Field(i int) string {
	if r.index[i] < 0 {
		return ""
	}
	return r.row[r.index[i]]
}

// lineError returns a *RowError about the current line as a whole.
func (r *Reader) lineError(err error) error {
	return &RowError{Prog: r.prog, Line: r.line, Err: err}
}

// FieldError returns a *RowError about column i of the current line.
func (r *Reader) FieldError(i int, err error) error {
	return &RowError{Prog: r.prog, Line: r.line, Field: r.cols.Names[i], Err: err}
}

// split splits a CSV line into r.row's fields, unquoting quoted ones.
func (r *Reader) split(b []byte) ([]string, error) {
	r.row = r.row[:0]
	for f := range strings.SplitSeq(string(b), ",") {
		f = strings.TrimSpace(f)
		if strings.IndexByte(f, '"') >= 0 {
			if len(f) < 2 || f[0] != '"' || f[len(f)-1] != '"' || strings.IndexByte(f[1:len(f)-1], '"') >= 0 {
				return nil, r.lineError(fmt.Errorf("field %d: %q: quotes only around a whole field", len(r.row)+1, f))
			}
			f = f[1 : len(f)-1]
		}
		r.row = append(r.row, f)
	}
	return r.row, nil
}
