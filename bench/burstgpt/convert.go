package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kvrouterd/kvrouterd/bench/tracecsv"
)

const (
	maxSession = 128 // bytes of a Session ID (BurstGPT's are UUIDs)
	// maxSeconds bounds Timestamp: the loader holds arrivals in a time.Duration (under 292
	// years), and 4·10^9 s is 126 years.
	maxSeconds = 4e9
)

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

// String is the line the command writes on standard error.
func (st stats) String() string {
	return fmt.Sprintf("burstgpt: %d rows, %d written; dropped: %d failed, %d without request tokens, %d of another model or log type",
		st.Rows, st.Written, st.Failures, st.EmptyPrompts, st.Filtered)
}

// The columns convert reads; the first three are required.
const (
	colTime = iota
	colRequest
	colResponse
	colSession
	colModel
	colLogType
)

var columns = tracecsv.Columns{
	Names:    []string{"Timestamp", "Request tokens", "Response tokens", "Session ID", "Model", "Log Type"},
	Required: colSession,
	Match:    func(name, want string) bool { return columnKey(name) == columnKey(want) },
	Example:  "Timestamp,Model,Request tokens,Response tokens,…",
	Want:     "Timestamp, Request tokens and Response tokens",
}

// columnKey is a column name as compared: case, spaces and underscores do not count, so
// "Session ID", "SessionID" and "session_id" are one column.
func columnKey(s string) string {
	return strings.ToLower(strings.NewReplacer(" ", "", "_", "").Replace(s))
}

// converter is the state of one convert call.
type converter struct {
	opt options
	rd  *tracecsv.Reader
	tw  *tracecsv.Writer
	st  stats
}

// convert reads a BurstGPT trace from r and writes it to w as JSON lines (see the package
// documentation), one row at a time. It returns what it counted; on bad input it stops at the
// first bad row with a *tracecsv.RowError, having written the rows before it.
func convert(r io.Reader, w io.Writer, opt options) (stats, error) {
	if opt.BlockSize < 1 || opt.BlockSize > tracecsv.MaxBlockSize {
		return stats{}, fmt.Errorf("burstgpt: block size %d: want 1 to %d", opt.BlockSize, tracecsv.MaxBlockSize)
	}
	c := converter{opt: opt, rd: tracecsv.NewReader(r, "burstgpt", columns), tw: tracecsv.NewWriter(w, opt.BlockSize)}
	err := tracecsv.Convert(c.rd, c.tw, c.row)
	return c.st, err
}

// row converts the current row.
func (c *converter) row() error {
	c.st.Rows++
	ms, err := secondsToMillis(c.rd.Field(colTime))
	if err != nil {
		return c.rd.FieldError(colTime, err)
	}
	in, err := tracecsv.ParseTokens(c.rd.Field(colRequest))
	if err != nil {
		return c.rd.FieldError(colRequest, err)
	}
	out, err := tracecsv.ParseTokens(c.rd.Field(colResponse))
	if err != nil {
		return c.rd.FieldError(colResponse, err)
	}
	session := c.rd.Field(colSession)
	if err := checkSession(session); err != nil {
		return c.rd.FieldError(colSession, err)
	}
	switch {
	case c.opt.Model != "" && c.rd.Field(colModel) != c.opt.Model,
		c.opt.LogType != "" && c.rd.Field(colLogType) != c.opt.LogType:
		c.st.Filtered++
		return nil
	case out == 0 && !c.opt.KeepFailures:
		c.st.Failures++
		return nil
	case in == 0:
		c.st.EmptyPrompts++
		return nil
	}
	if err := c.tw.CheckInput(in); err != nil {
		return c.rd.FieldError(colRequest, err)
	}
	if err := c.tw.WriteRequest(ms, in, out, session); err != nil {
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
