// Command tracegen writes the built-in shared-prefix workload (bench/trace's SyntheticSource:
// system prompts, multi-turn sessions, fan-outs over documents) as a JSON-lines trace in
// Mooncake's form, of any length, in bounded memory: the long trace that shows a replay
// streaming it (bench/fleetsim --stream) holds only what is in flight.
//
//	go run ./bench/tracegen --requests 10000000 > /tmp/gen10m.jsonl
//	go run ./bench/fleetsim --stream --trace /tmp/gen10m.jsonl --modes kv
//
// The output starts with a header line {"block_size": B, "time_unit": "ms"}; each row then
// gives the request's arrival in milliseconds, its prompt and output lengths, its session id
// when it is a session's turn, and one hash id per started block of B tokens (--block-size,
// 512 by default). A block's id is a 48-bit hash of the block's tokens and the id before it, so
// it stands for the whole prefix, as in Mooncake's traces: prompts that share their first k
// blocks share their first k ids. (Two different prefixes get one id with probability about
// n²/2⁴⁹ for n distinct blocks: once in a 10 M-request trace.)
package main

import (
	"bufio"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/zeebo/xxh3"
)

func main() {
	var (
		n         = flag.Int("requests", 2400, "requests, on average (the workload's rate is fixed; its duration follows)")
		blockSize = flag.Int("block-size", 512, "tokens per hash id")
		seed      = flag.Uint64("seed", 1, "the workload's seed")
	)
	flag.Parse()
	if *n < 1 || *blockSize < 1 {
		fmt.Fprintln(os.Stderr, "tracegen: --requests and --block-size must be positive")
		os.Exit(2)
	}
	cfg := trace.DefaultSynthetic()
	cfg.Seed = *seed
	cfg.Duration = time.Duration(float64(*n) / cfg.Rate * float64(time.Second))
	w := bufio.NewWriterSize(os.Stdout, 1<<20)
	fmt.Fprintf(w, "{\"block_size\": %d, \"time_unit\": \"ms\"}\n", *blockSize)
	src := trace.SyntheticSource(cfg)
	var (
		line  []byte
		block []byte
		rows  int
	)
	for {
		r, ok := src.Next()
		if !ok {
			break
		}
		line = append(line[:0], `{"timestamp": `...)
		line = strconv.AppendFloat(line, float64(r.At)/float64(time.Millisecond), 'f', 3, 64)
		line = append(line, `, "input_length": `...)
		line = strconv.AppendInt(line, int64(len(r.Tokens)), 10)
		line = append(line, `, "output_length": `...)
		line = strconv.AppendInt(line, int64(r.Output), 10)
		if r.Session != 0 {
			line = append(line, `, "session_id": `...)
			line = strconv.AppendUint(line, r.Session, 10)
		}
		line = append(line, `, "hash_ids": [`...)
		var id uint64
		for lo := 0; lo < len(r.Tokens); lo += *blockSize {
			block = binary.LittleEndian.AppendUint64(block[:0], id)
			for _, t := range r.Tokens[lo:min(lo+*blockSize, len(r.Tokens))] {
				block = binary.LittleEndian.AppendUint32(block, t)
			}
			id = xxh3.Hash(block) >> 16
			if lo > 0 {
				line = append(line, ", "...)
			}
			line = strconv.AppendUint(line, id, 10)
		}
		line = append(line, "]}\n"...)
		if _, err := w.Write(line); err != nil {
			fmt.Fprintln(os.Stderr, "tracegen:", err)
			os.Exit(1)
		}
		rows++
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "tracegen:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "tracegen: %d requests\n", rows)
}
