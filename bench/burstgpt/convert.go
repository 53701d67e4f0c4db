package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

const (
	maxBlockSize = 1 << 20
	maxLine      = 64 << 10 // a row is under 100 bytes; a longer line is not this format
	maxTokens    = 1 << 24  // per request, far above any context window
	maxIDs       = 1 << 20  // hash ids per row, so that the loader's 64 MiB line limit holds
	maxSession   = 128      // bytes of a Session ID (BurstGPT's are UUIDs)
	// maxSeconds bounds Timestamp: the loader holds arrivals in a time.Duration (under 292
	// years), and 4·10^9 s is 126 years.
	maxSeconds = 4e9
)

// errRow is wrapped by every error about the input's content.
var errRow = errors.New("burstgpt: bad input")

// rowError says which line of the input, and which column of it, was wrong.
type rowError struct {
	Line  int    // 1-based
	Field string // the column's name; empty when the line as a whole is wrong
	Err   error
}

func (e *rowError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("burstgpt: line %d: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("burstgpt: line %d: field %s: %v", e.Line, e.Field, e.Err)
}

func (e *rowError) Unwrap() []error { return []error{errRow, e.Err} }

// options is a conversion's configuration, a plain value.
type options struct {
	BlockSize    int    // tokens per output hash id
	KeepFailures bool   // keep rows with Response tokens 0
	Model        string // keep only this Model; empty: all
	LogType      string // keep only this Log Type; empty: all
}

// stats counts a conversion's rows: plain data.
type stats struct {
	Rows         int // data rows read
	Written      int // requests written
	Failures     int // rows with Response tokens 0, dropped
	EmptyPrompts int // rows with Request tokens 0, dropped
	Filtered     int // rows of another Model or Log Type, dropped
}

// The columns convert reads; the first three are required.
const (
	colTime = iota
	colRequest
	colResponse
	colSession
	colModel
	colLogType
	nCols
	nRequired = colSession
)

var colNames = [nCols]string{"Timestamp", "Request tokens", "Response tokens", "Session ID", "Model", "Log Type"}

// converter is the state of one convert call.
type converter struct {
	opt    options
	w      io.Writer
	cols   [nCols]int // each column's index in a row, -1 if absent
	fields int        // columns in the header
	nextID uint64     // the first hash id of the next request
	buf    []byte     // the line being written
	split  []string   // a row's fields, reused
	st     stats
}

// convert reads a BurstGPT trace from r and writes it to w as JSON lines (see the package
// documentation), one row at a time. It returns what it counted; on bad input it stops at the
// first bad row with a *rowError, having written the rows before it.
func convert(r io.Reader, w io.Writer, opt options) (stats, error) {
	if opt.BlockSize < 1 || opt.BlockSize > maxBlockSize {
		return stats{}, fmt.Errorf("burstgpt: block size %d: want 1 to %d", opt.BlockSize, maxBlockSize)
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
		return c.st, fmt.Errorf("burstgpt: after line %d: %w", line, err)
	}
	if c.fields < 0 {
		return c.st, &rowError{Line: line, Err: errors.New("no header row: want Timestamp,Model,Request tokens,Response tokens,…")}
	}
	return c.st, nil
}

// splitRow splits a CSV line into its fields, unquoting quoted ones. Quoted fields may not
// hold commas or quotes; the format has none.
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

// columnKey is a column name as compared: case, spaces and underscores do not count, so
// "Session ID", "SessionID" and "session_id" are one column.
func columnKey(s string) string {
	return strings.ToLower(strings.NewReplacer(" ", "", "_", "").Replace(s))
}

// header finds the columns and writes the output's header line.
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
			if columnKey(name) == columnKey(want) {
				if c.cols[i] >= 0 {
					return &rowError{Line: line, Field: want, Err: errors.New("appears twice in the header")}
				}
				c.cols[i] = j
			}
		}
	}
	for i, want := range colNames[:nRequired] {
		if c.cols[i] < 0 {
			return &rowError{Line: line, Field: want, Err: fmt.Errorf("missing from the header %q: want Timestamp, Request tokens and Response tokens", b)}
		}
	}
	c.fields = len(names)
	c.buf = fmt.Appendf(c.buf[:0], "{\"block_size\":%d,\"time_unit\":\"ms\"}\n", c.opt.BlockSize)
	_, err = c.w.Write(c.buf)
	return err
}

// field returns column i of a row, "" when the trace has no such column.
func (c *converter) field(f []string, i int) string {
	if c.cols[i] < 0 {
		return ""
	}
	return f[c.cols[i]]
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
	ms, err := secondsToMillis(c.field(f, colTime))
	if err != nil {
		return &rowError{Line: line, Field: colNames[colTime], Err: err}
	}
	in, err := parseTokens(c.field(f, colRequest))
	if err != nil {
		return &rowError{Line: line, Field: colNames[colRequest], Err: err}
	}
	out, err := parseTokens(c.field(f, colResponse))
	if err != nil {
		return &rowError{Line: line, Field: colNames[colResponse], Err: err}
	}
	session := c.field(f, colSession)
	if err := checkSession(session); err != nil {
		return &rowError{Line: line, Field: colNames[colSession], Err: err}
	}
	switch {
	case c.opt.Model != "" && c.field(f, colModel) != c.opt.Model,
		c.opt.LogType != "" && c.field(f, colLogType) != c.opt.LogType:
		c.st.Filtered++
		return nil
	case out == 0 && !c.opt.KeepFailures:
		c.st.Failures++
		return nil
	case in == 0:
		c.st.EmptyPrompts++
		return nil
	}
	n := (in + c.opt.BlockSize - 1) / c.opt.BlockSize
	if n > maxIDs {
		return &rowError{Line: line, Field: colNames[colRequest], Err: fmt.Errorf("%d tokens make %d hash ids of %d tokens, over %d: give a larger --block-size", in, n, c.opt.BlockSize, maxIDs)}
	}
	c.buf = appendRow(c.buf[:0], ms, in, out, c.nextID, n, session)
	c.nextID += uint64(n)
	if _, err := c.w.Write(c.buf); err != nil {
		return err
	}
	c.st.Written++
	return nil
}

// secondsToMillis shifts a decimal number of seconds ("5", "5.25", "0.0001") three places,
// exactly, into the digits of milliseconds ("5000", "5250", "0.1").
func secondsToMillis(s string) (string, error) {
	whole, frac, dot := strings.Cut(s, ".")
	if whole == "" || len(whole) > 10 || len(frac) > 9 || (dot && frac == "") || !digits(whole) || !digits(frac) {
		return "", fmt.Errorf("%q: want seconds, a decimal number such as 5 or 5.25", s)
	}
	v, _ := strconv.ParseUint(whole, 10, 64) // ten digits fit
	if v >= maxSeconds {
		return "", fmt.Errorf("%s: want under %.0f seconds", s, float64(maxSeconds))
	}
	frac += "000"[min(len(frac), 3):]
	ms := v*1000 + uint64(frac[0]-'0')*100 + uint64(frac[1]-'0')*10 + uint64(frac[2]-'0')
	out := strconv.FormatUint(ms, 10)
	if rest := strings.TrimRight(frac[3:], "0"); rest != "" {
		out += "." + rest
	}
	return out, nil
}

func digits(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
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

// checkSession accepts a Session ID that can be written into JSON as it is: printable ASCII
// without quotes or backslashes, as BurstGPT's UUIDs are.
func checkSession(s string) error {
	if len(s) > maxSession {
		return fmt.Errorf("%d bytes: want at most %d", len(s), maxSession)
	}
	for i := range len(s) {
		if s[i] <= ' ' || s[i] > '~' || s[i] == '"' || s[i] == '\\' {
			return fmt.Errorf("%q: want printable ASCII without spaces, quotes or backslashes", s)
		}
	}
	return nil
}

// appendRow appends one request's JSON line: n hash ids from firstID, and the session when it
// is not empty.
func appendRow(dst []byte, ms string, in, out int, firstID uint64, n int, session string) []byte {
	dst = append(dst, `{"timestamp":`...)
	dst = append(dst, ms...)
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
	dst = append(dst, ']')
	if session != "" {
		dst = append(dst, `,"session_id":"`...)
		dst = append(dst, session...)
		dst = append(dst, '"')
	}
	return append(dst, "}\n"...)
}
