package trace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// Source yields a workload's requests in arrival order, one at a time, for a replay that must
// not hold the whole workload: a trace streamed from its file (MooncakeSource), a generated
// workload (SyntheticSource), or a slice (SliceSource). A returned Request is the caller's: a
// source never writes to its Tokens again. After Next returns false, Err tells the end of the
// workload (nil) from a failure. A Source is used by one goroutine.
type Source interface {
	Next() (Request, bool)
	Err() error
}

// SliceSource yields reqs in their order.
func SliceSource(reqs []Request) Source { return &sliceSource{reqs: reqs} }

type sliceSource struct {
	reqs []Request
	i    int
}

func (s *sliceSource) Next() (Request, bool) {
	if s.i == len(s.reqs) {
		return Request{}, false
	}
	s.i++
	return s.reqs[s.i-1], true
}

func (s *sliceSource) Err() error { return nil }

// Collect reads src to its end. It panics on a source's error; sources that can fail (a file's)
// are read with their own loaders (ReadMooncake).
func Collect(src Source) []Request {
	var reqs []Request
	for {
		r, ok := src.Next()
		if !ok {
			break
		}
		reqs = append(reqs, r)
	}
	if err := src.Err(); err != nil {
		panic(fmt.Sprintf("trace: Collect: %v", err))
	}
	return reqs
}

// ScaleSource is Scale for a source: src's requests with arrival times multiplied by f. It
// panics unless f is positive and finite.
func ScaleSource(src Source, f float64) Source {
	if !(f > 0) || math.IsInf(f, 0) {
		panic(fmt.Sprintf("trace: ScaleSource factor %v: want a positive finite number", f))
	}
	return &scaled{src: src, f: f}
}

type scaled struct {
	src Source
	f   float64
}

func (s *scaled) Next() (Request, bool) {
	r, ok := s.src.Next()
	r.At = time.Duration(float64(r.At) * s.f)
	return r, ok
}

func (s *scaled) Err() error { return s.src.Err() }

// MooncakeSource streams a trace in any form ReadMooncake reads, making each prompt's tokens as
// its row is read: memory holds one row at a time (and, for Qwen's chat_id chains, one entry
// per chat), whatever the trace's length. Rows must come in time order, as every public trace
// has them; a row earlier than the one before it is an error naming its line (ReadMooncake
// sorts a trace that is not). A header line must come before the first row. Numeric epoch
// timestamps start at the first row's time. opt.Limit counts rows as ReadMooncake does.
func MooncakeSource(r io.Reader, opt MooncakeOptions) Source {
	rr, err := newRowsReader(opt)
	return &mooncakeSource{rr: rr, sc: newLineScanner(r), err: err}
}

type mooncakeSource struct {
	rr    *rowsReader
	sc    *bufio.Scanner
	line  int
	rows  int
	base  float64
	last  float64 // the last row's raw timestamp
	first bool    // a row has been read; base holds
	err   error
	done  bool
}

func (s *mooncakeSource) Err() error { return s.err }

func (s *mooncakeSource) Next() (Request, bool) {
	if s.done || s.err != nil {
		return Request{}, false
	}
	for s.sc.Scan() {
		s.line++
		b := bytes.TrimSpace(s.sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if s.rr.opt.Limit > 0 && s.rows == s.rr.opt.Limit {
			break
		}
		row, raw, ok, err := s.rr.parse(b, s.line)
		if err != nil {
			s.err = err
			return Request{}, false
		}
		if !ok {
			continue
		}
		if !s.first {
			s.first, s.base = true, s.rr.base(raw)
		}
		if s.rows > 0 && raw < s.last {
			s.err = &RowError{Line: s.line, Field: "timestamp", Err: errors.New("before the row before it: a streamed trace must be in time order; sort it, or load it whole")}
			return Request{}, false
		}
		s.last = raw
		if row.At, err = s.rr.arrival(raw, s.base, s.line); err != nil {
			s.err = err
			return Request{}, false
		}
		s.rows++
		toks := row.Tokens
		if toks == nil {
			toks = s.rr.opt.appendBlocks(make([]uint32, 0, row.InputLength), row.HashIDs, row.InputLength, row.BlockSize)
		}
		return Request{At: row.At, Tokens: toks, Output: row.OutputLength, Session: row.Session}, true
	}
	if err := s.sc.Err(); err != nil {
		s.err = fmt.Errorf("trace: after line %d: %w", s.line, err)
	}
	s.done = true
	return Request{}, false
}
