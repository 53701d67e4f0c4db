// Command burstgpt converts the BurstGPT traces (HPMLL/BurstGPT: ChatGPT and GPT-4 requests
// served on Azure, BurstGPT_1.csv to BurstGPT_3.csv and their _without_fails variants) into the
// JSON lines that bench/trace reads and bench/fleetsim replays.
//
//	go run ./bench/burstgpt --in BurstGPT_1.csv --out burstgpt1.jsonl
//	go run ./bench/fleetsim --trace burstgpt1.jsonl
//
// # Input
//
// A CSV file with a header row naming at least the columns Timestamp, Request tokens and
// Response tokens, in any order and any case; Session ID (BurstGPT_3), Model and Log Type are
// read when present, other columns (Total tokens, Elapsed time) are ignored, and so are blank
// lines, a leading byte-order mark and CRLF line ends. Timestamp is the request's submission
// time in seconds from midnight of the trace's first day, a decimal number such as 5 or 5.25.
// Fields may be quoted but may not contain commas. The input is read one row at a time, so
// memory stays bounded however long the trace is.
//
// Rows are dropped, and counted on standard error, when Response tokens is 0 (BurstGPT marks
// a failed request so; --keep-failures keeps them, with output_length 0, which bench/fleet
// serves as one token), when Request tokens is 0 (no prompt to route or cache), and when
// --model or --log-type is given and the row's Model or Log Type differs.
//
// # Output
//
// A header line {"block_size": B, "time_unit": "ms"}, then one row per request:
//
//	{"timestamp": 5000, "input_length": 472, "output_length": 18, "hash_ids": [0], "session_id": "…"}
//
// timestamp is Timestamp converted exactly from seconds to milliseconds (the loader moves a
// trace whose first request comes over a day after 0, such as BurstGPT_2's, to start at 0, and
// keeps every interval). input_length is Request tokens, output_length Response tokens;
// session_id is Session ID, written only when the row has one (API calls have none).
//
// # Prefixes
//
// BurstGPT carries lengths, not prompt content. Session ID says which requests belong to one
// conversation, but not whether a turn's request repeats the turns before it, nor how much of
// it; so the converter does not chain turns. Every request gets hash ids of its own (a counter
// running through the file, ⌈input_length / B⌉ of them, B = --block-size, 512 by default), and
// the output has no prefix sharing: the hit rate any router can reach on it is 0. The session
// ids stay, so a replay can hold a conversation's next turn until its previous one is
// answered (bench/fleetsim's closed loop).
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
	flag.BoolVar(&opt.KeepFailures, "keep-failures", false, "keep failed requests (Response tokens 0), with output_length 0")
	flag.StringVar(&opt.Model, "model", "", "keep only rows of this Model (ChatGPT or GPT-4; empty: all)")
	flag.StringVar(&opt.LogType, "log-type", "", `keep only rows of this Log Type ("Conversation log" or "API log"; empty: all)`)
	tracecsv.Main("burstgpt", "[flags]", &opt.BlockSize, func(r io.Reader, w io.Writer) (fmt.Stringer, error) { return convert(r, w, opt) })
}
