package tracecsv

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
)

// ConvertFiles runs convert from the file at inPath (empty: standard input) to the file at
// outPath, created or truncated (empty: standard output), through a 64 KiB buffer. Once convert
// has returned and the buffer is flushed, it writes convert's summary (a command's counts), when
// not nil, to standard error as a line, whether or not convert failed. An error of convert's or
// the flush's comes back prefixed with inPath when there is one; an error opening, creating or
// closing a file, as the os package words it.
func ConvertFiles(inPath, outPath string, convert func(io.Reader, io.Writer) (summary fmt.Stringer, err error)) (err error) {
	var r io.Reader = os.Stdin
	if inPath != "" {
		f, err := os.Open(inPath)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	var w io.Writer = os.Stdout
	if outPath != "" {
		f, err := os.Create(outPath)
		if err != nil {
			return err
		}
		defer func() {
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}()
		w = f
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	summary, err := convert(r, bw)
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	if summary != nil {
		fmt.Fprintln(os.Stderr, summary)
	}
	if err != nil && inPath != "" {
		return fmt.Errorf("%s: %w", inPath, err)
	}
	return err
}

// Main is the rest of a converter command's main once its own flags are defined on
// flag.CommandLine, blockSize among them: it adds --in and --out, parses, refuses arguments and
// a block size outside 1 to MaxBlockSize (exit 2), and runs ConvertFiles with convert, which
// reads the parsed flags (exit 1 on its error). name prefixes messages; flags is the usage line's
// part before --in.
func Main(name, flags string, blockSize *int, convert func(io.Reader, io.Writer) (fmt.Stringer, error)) {
	in := flag.String("in", "", "the CSV trace (empty: standard input)")
	out := flag.String("out", "", "the JSON-lines output (empty: standard output)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s %s [--in FILE.csv] [--out FILE.jsonl]\n", name, flags)
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 0 || *blockSize < 1 || *blockSize > MaxBlockSize {
		fmt.Fprintf(os.Stderr, "%s: want no arguments and --block-size from 1 to %d\n", name, MaxBlockSize)
		os.Exit(2)
	}
	if err := ConvertFiles(*in, *out, convert); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
