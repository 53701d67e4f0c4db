package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

const (
	maxBlockSize = 1 << 20
	maxLine      = 64 << 10 // a row is under 50 bytes; a longer line is not this format
	maxTokens    = 1 << 24  // per request, far above any context window
	maxIDs       = 1 << 20  // hash ids per row, so that the loader's 64 MiB line limit holds
)

// errRow is wrapped by every error about the input's content.
var errRow = errors.New("azuretrace: bad input")

// rowError says which line of the input, and which column of it, was wrong.
type rowError struct {
	Line  int    // 1-based
	Field string // the column's name; empty when the line as a whole is wrong
	Err   error
}

func (e *rowError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("azuretrace: line %d: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("azuretrace: line %d: field %s: %v", e.Line, e.Field, e.Err)
}

func (e *rowError) Unwrap() []error { return []error{errRow, e.Err} }

// options is a conversion's configuration, a plain value.
type options struct {
	BlockSize int // tokens per output hash id
}

// stats counts a conversion's rows: plain data.
type stats struct {
	Rows         int // data rows read
	Written      int // requests written
	EmptyPrompts int // rows with ContextTokens 0, dropped
}

// The columns convert reads.
const (
	colTime = iota
	colContext
	colGenerated
	nCols
)

var colNames = [nCols]string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"}

// converter is the state of one convert call.
type converter struct {
	opt    options
	w      io.Writer
	cols   [nCols]int // each read column's index in a row
	fields int        // columns in the header
	nextID uint64     // the first hash id of the next request
	buf    []byte     // the line being written
	split  []string   // a row's fields, reused
	st     stats
}

// convert reads an Azure LLM inference trace from r and writes it to w as JSON lines (see the
// package documentation), one row at a time. It returns what it counted; on bad input it
// stops at the first bad row with a *rowError, having written the rows before it.
func convert(r io.Reader, w io.Writer, opt options) (stats, error) {
	if opt.BlockSize < 1 || opt.BlockSize > maxBlockSize {
		return stats{}, fmt.Errorf("azuretrace: block size %d: want 1 to %d", opt.BlockSize, maxBlockSize)
	}
	c := converter{opt: opt, w: w, fields: -1}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4<<10), maxLine)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if line == 1 {
			b = bytes.TrimPrefix(b, []byte("\ufeff"))
		}
		b = bytes.TrimSpace(b) // CRLF too
		if len(b) == 0 {
			continue
		}
		var err error
		if c.fields < 0 {
			err = c.header(b, line)
		} else {
			err = c.row(b, line)
		}
		if err != nil {
			return c.st, err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return c.st, &rowError{Line: line + 1, Err: fmt.Errorf("longer than %d bytes: not a row of this format", maxLine)}
		}
		return c.st, fmt.Errorf("azuretrace: after line %d: %w", line, err)
	}
	if c.fields < 0 {
		return c.st, &rowError{Line: line, Err: errors.New("no header row: want TIMESTAMP,ContextTokens,GeneratedTokens")}
	}
	return c.st, nil
}

// splitRow splits a CSV line into its fields, unquoting quoted ones. Quoted fields may not
// hold commas or quotes; neither format has any.
func (c *converter) splitRow(b []byte, line int) ([]string, error) {
	c.split = c.split[:0]
	for f := range strings.SplitSeq(string(b), ",") {
		f = strings.TrimSpace(f)
		if strings.IndexByte(f, '"') >= 0 {
			if len(f) < 2 || f[0] != '"' || f[len(f)-1] != '"' || strings.IndexByte(f[1:len(f)-1], '"') >= 0 {
				return nil, &rowError{Line: line, Err: fmt.Errorf("field %d: %q: quotes only around a whole field", len(c.split)+1, f)}
			}
			f = f[1 : len(f)-1]
		}
		c.split = append(c.split, f)
	}
	return c.split, nil
}

// header finds the columns convert reads and writes the output's header line.
func (c *converter) header(b []byte, line int) error {
	names, err := c.splitRow(b, line)
	if err != nil {
		return err
	}
	for i := range c.cols {
		c.cols[i] = -1
	}
	for j, name := range names {
		for i, want := range colNames {
			if strings.EqualFold(name, want) {
				if c.cols[i] >= 0 {
					return &rowError{Line: line, Field: want, Err: errors.New("appears twice in the header")}
				}
				c.cols[i] = j
			}
		}
	}
	for i, want := range colNames {
		if c.cols[i] < 0 {
			return &rowError{Line: line, Field: want, Err: fmt.Errorf("missing from the header %q: want TIMESTAMP,ContextTokens,GeneratedTokens", b)}
		}
	}
	c.fields = len(names)
	c.buf = fmt.Appendf(c.buf[:0], "{\"block_size\":%d,\"time_unit\":\"ms\"}\n", c.opt.BlockSize)
	_, err = c.w.Write(c.buf)
	return err
}

// row converts one data row.
func (c *converter) row(b []byte, line int) error {
	f, err := c.splitRow(b, line)
	if err != nil {
		return err
	}
	if len(f) != c.fields {
		return &rowError{Line: line, Err: fmt.Errorf("%d fields, but the header has %d", len(f), c.fields)}
	}
	c.st.Rows++
	us, err := parseTime(f[c.cols[colTime]])
	if err != nil {
		return &rowError{Line: line, Field: colNames[colTime], Err: err}
	}
	in, err := parseTokens(f[c.cols[colContext]])
	if err != nil {
		return &rowError{Line: line, Field: colNames[colContext], Err: err}
	}
	out, err := parseTokens(f[c.cols[colGenerated]])
	if err != nil {
		return &rowError{Line: line, Field: colNames[colGenerated], Err: err}
	}
	if in == 0 {
		c.st.EmptyPrompts++
		return nil
	}
	n := (in + c.opt.BlockSize - 1) / c.opt.BlockSize
	if n > maxIDs {
		return &rowError{Line: line, Field: colNames[colContext], Err: fmt.Errorf("%d tokens make %d hash ids of %d tokens, over %d: give a larger --block-size", in, n, c.opt.BlockSize, maxIDs)}
	}
	c.buf = appendRow(c.buf[:0], us, in, out, c.nextID, n)
	c.nextID += uint64(n)
	if _, err := c.w.Write(c.buf); err != nil {
		return err
	}
	c.st.Written++
	return nil
}

// The TIMESTAMPs accepted: the loader reads a first timestamp under a day from 0 as an offset
// rather than an epoch time, and holds arrivals in a time.Duration (under 292 years).
var (
	minTime = time.Date(1970, 1, 2, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// parseTime reads a TIMESTAMP into microseconds since the Unix epoch, rounded.
func parseTime(s string) (int64, error) {
	for _, layout := range []string{"2006-01-02 15:04:05", "2006-01-02T15:04:05", "2006-01-02 15:04:05Z07:00", time.RFC3339} {
		// A fraction after the seconds is accepted though the layouts do not give one.
		t, err := time.Parse(layout, s)
		if err != nil {
			continue
		}
		if t.Before(minTime) || !t.Before(maxTime) {
			return 0, fmt.Errorf("%q: want a time from %v to the end of %d", s, minTime.Format(time.DateOnly), maxTime.Year()-1)
		}
		return t.Round(time.Microsecond).UnixMicro(), nil
	}
	return 0, fmt.Errorf("%q: want a time such as 2023-11-16 18:15:46.6805900", s)
}

// parseTokens reads a token count.
func parseTokens(s string) (int, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%q: want a whole number of tokens", s)
	case v < 0 || v > maxTokens:
		return 0, fmt.Errorf("%d: want 0 to %d tokens", v, maxTokens)
	}
	return int(v), nil
}

// appendRow appends one request's JSON line: timestamp us microseconds (written in
// milliseconds), n hash ids from firstID.
func appendRow(dst []byte, us int64, in, out int, firstID uint64, n int) []byte {
	dst = append(dst, `{"timestamp":`...)
	dst = strconv.AppendInt(dst, us/1000, 10)
	if frac := us % 1000; frac != 0 {
		dst = append(dst, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
		for dst[len(dst)-1] == '0' {
			dst = dst[:len(dst)-1]
		}
	}
	dst = append(dst, `,"input_length":`...)
	dst = strconv.AppendInt(dst, int64(in), 10)
	dst = append(dst, `,"output_length":`...)
	dst = strconv.AppendInt(dst, int64(out), 10)
	dst = append(dst, `,"hash_ids":[`...)
	for i := range n {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, firstID+uint64(i), 10)
	}
	return append(dst, "]}\n"...)
}
