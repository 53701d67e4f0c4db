// Command azuretrace converts Azure's public LLM inference traces (the 2023 code and
// conversation traces, AzureLLMInferenceTrace_code.csv and _conv.csv, and the 2024 week-long
// ones, whose documented schema is the same; the tests have rows of 2023's only) into the JSON
// lines that bench/trace reads and bench/fleetsim replays.
//
//	go run ./bench/azuretrace < AzureLLMInferenceTrace_conv.csv > azure_conv.jsonl
//	go run ./bench/fleetsim --trace azure_conv.jsonl
//
// # Input
//
// A CSV file with a header row naming the columns TIMESTAMP, ContextTokens and
// GeneratedTokens, in any order; other columns are ignored, and so are blank lines, a leading
// byte-order mark and CRLF line ends. TIMESTAMP is an ISO-8601 time from 1970-01-02 to 2199 such as
// "2023-11-16 18:15:46.6805900" (space or T between date and time, any fraction up to
// nanoseconds, an optional zone; without one it is read as UTC, which changes no interval).
// Fields may be quoted but may not contain commas. The input is read one row at a time, so
// memory stays bounded however long the trace is.
//
// # Output
//
// A header line {"block_size": B, "time_unit": "ms"}, then one row per request:
//
//	{"timestamp": 1700158546680.59, "input_length": 374, "output_length": 44, "hash_ids": [0]}
//
// timestamp is the request's TIMESTAMP in milliseconds since the Unix epoch, rounded to the
// microsecond; the loader moves epoch times to start at 0 and keeps every interval (to a
// quarter of a microsecond, the precision of a float64 at epoch milliseconds), so the rows
// need not be in time order. input_length is ContextTokens, output_length
// GeneratedTokens. A row with no context tokens is dropped (there is no prompt to route or
// cache) and counted on standard error.
//
// # Prefixes
//
// The traces carry only lengths: Azure withholds prompt content, and the rows have no session
// or conversation id. The output therefore has no prefix sharing at all: every request gets
// hash ids of its own (a counter running through the file, ⌈input_length / B⌉ of them, B =
// --block-size, 512 by default), so no two prompts share even their first block. A replay of
// it measures load balance and queueing under Azure's arrival and length pattern; the prefix
// hit rate any router can reach on it is 0.
//
// Errors name the line and the column that was wrong; the command exits with status 1 on bad
// input (after writing the rows before it) and 2 on bad flags.
package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/kvrouterd/kvrouterd/bench/tracecsv"
)

func main() {
	var opt options
	flag.IntVar(&opt.BlockSize, "block-size", 512, "tokens per hash id in the output (Mooncake's is 512)")
	tracecsv.Main("azuretrace", "[--block-size N]", &opt.BlockSize, func(r io.Reader, w io.Writer) (fmt.Stringer, error) { return convert(r, w, opt) })
}
