package tracecsv

import (
	"fmt"
	"io"
	"strconv"
)

const (
	// MaxBlockSize bounds the tokens per hash id.
	MaxBlockSize = 1 << 20
	// MaxIDs bounds the hash ids of one request, so that the loader's 64 MiB line limit holds.
	MaxIDs = 1 << 20
)

// Writer writes the loader's JSON lines: a header line, then one line per request, with hash
// ids of its own from a counter that runs through the output. It is owned by one goroutine.
type Writer struct {
	w         io.Writer
	blockSize int
	nextID    uint64 // the first hash id of the next request
	buf       []byte // the line being written
}

// NewWriter returns a Writer to w of hash ids of blockSize tokens, 1 to MaxBlockSize, which
// the caller checks (its flag's message is its own).
func NewWriter(w io.Writer, blockSize int) *Writer {
	return &Writer{w: w, blockSize: blockSize}
}

// WriteHeader writes the header line, {"block_size":B,"time_unit":"ms"}.
func (w *Writer) WriteHeader() error {
	w.buf = fmt.Appendf(w.buf[:0], "{\"block_size\":%d,\"time_unit\":\"ms\"}\n", w.blockSize)
	_, err := w.w.Write(w.buf)
	return err
}

// ids returns the number of hash ids input tokens take.
func (w *Writer) ids(input int) int { return (input + w.blockSize - 1) / w.blockSize }

// CheckInput returns an error when input tokens take more than MaxIDs hash ids, so that the
// caller can say which row and column it was before WriteRequest refuses it.
func (w *Writer) CheckInput(input int) error {
	if n := w.ids(input); n > MaxIDs {
		return fmt.Errorf("%d tokens make %d hash ids of %d tokens, over %d: give a larger --block-size", input, n, w.blockSize, MaxIDs)
	}
	return nil
}

// WriteRequest writes one request's line: timestamp, the digits of a JSON number of
// milliseconds, as it is; ⌈input / block size⌉ new hash ids; session when it is not empty, as
// it is, so that it must need no JSON escaping.
func (w *Writer) WriteRequest(timestamp string, input, output int, session string) error {
	if err := w.CheckInput(input); err != nil {
		return err
	}
	n := w.ids(input)
	dst := append(w.buf[:0], `{"timestamp":`...)
	dst = append(dst, timestamp...)
	dst = append(dst, `,"input_length":`...)
	dst = strconv.AppendInt(dst, int64(input), 10)
	dst = append(dst, `,"output_length":`...)
	dst = strconv.AppendInt(dst, int64(output), 10)
	dst = append(dst, `,"hash_ids":[`...)
	for i := range n {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, w.nextID+uint64(i), 10)
	}
	dst = append(dst, ']')
	if session != "" {
		dst = append(dst, `,"session_id":"`...)
		dst = append(dst, session...)
		dst = append(dst, '"')
	}
	w.buf = append(dst, "}\n"...)
	w.nextID += uint64(n)
	_, err := w.w.Write(w.buf)
	return err
}
