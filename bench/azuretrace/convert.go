package main

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/tracecsv"
)

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

// String is the line the command writes on standard error.
func (st stats) String() string {
	return fmt.Sprintf("azuretrace: %d rows, %d written, %d without context tokens dropped", st.Rows, st.Written, st.EmptyPrompts)
}

// The columns convert reads.
const (
	colTime = iota
	colContext
	colGenerated
)

var columns = tracecsv.Columns{
	Names:    []string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"},
	Required: 3,
	Example:  "TIMESTAMP,ContextTokens,GeneratedTokens",
	Want:     "TIMESTAMP,ContextTokens,GeneratedTokens",
}

// converter is the state of one convert call.
type converter struct {
	rd *tracecsv.Reader
	tw *tracecsv.Writer
	ts []byte // the timestamp being written
	st stats
}

// convert reads an Azure LLM inference trace from r and writes it to w as JSON lines (see the
// package documentation), one row at a time. It returns what it counted; on bad input it
// stops at the first bad row with a *tracecsv.RowError, having written the rows before it.
func convert(r io.Reader, w io.Writer, opt options) (stats, error) {
	if opt.BlockSize < 1 || opt.BlockSize > tracecsv.MaxBlockSize {
		return stats{}, fmt.Errorf("azuretrace: block size %d: want 1 to %d", opt.BlockSize, tracecsv.MaxBlockSize)
	}
	c := converter{rd: tracecsv.NewReader(r, "azuretrace", columns), tw: tracecsv.NewWriter(w, opt.BlockSize)}
	err := tracecsv.Convert(c.rd, c.tw, c.row)
	return c.st, err
}

// row converts the current row.
func (c *converter) row() error {
	c.st.Rows++
	us, err := parseTime(c.rd.Field(colTime))
	if err != nil {
		return c.rd.FieldError(colTime, err)
	}
	in, err := tracecsv.ParseTokens(c.rd.Field(colContext))
	if err != nil {
		return c.rd.FieldError(colContext, err)
	}
	out, err := tracecsv.ParseTokens(c.rd.Field(colGenerated))
	if err != nil {
		return c.rd.FieldError(colGenerated, err)
	}
	if in == 0 {
		c.st.EmptyPrompts++
		return nil
	}
	if err := c.tw.CheckInput(in); err != nil {
		return c.rd.FieldError(colContext, err)
	}
	c.ts = appendMillis(c.ts[:0], us)
	if err := c.tw.WriteRequest(string(c.ts), in, out, ""); err != nil {
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

// appendMillis appends us microseconds as a JSON number of milliseconds, with no trailing
// zeros after the point.
func appendMillis(dst []byte, us int64) []byte {
	dst = strconv.AppendInt(dst, us/1000, 10)
	if frac := us % 1000; frac != 0 {
		dst = append(dst, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
		for dst[len(dst)-1] == '0' {
			dst = dst[:len(dst)-1]
		}
	}
	return dst
}
