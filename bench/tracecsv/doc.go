// Package tracecsv turns CSV request traces into the JSON lines that bench/trace loads: it is the
// part the trace converters (bench/azuretrace, bench/burstgpt) share, and each of them keeps only
// its columns, its field parsers and its filters.
//
// # Input
//
// A Reader reads a CSV trace one line at a time, so memory stays bounded however long the trace
// is. It skips a leading byte-order mark, blank lines and the spaces around a line (CRLF line
// ends too), and refuses a line longer than MaxLine. The first line left is the header: it names
// the columns, and a Reader finds the ones its caller reads (Columns) by name, in any order,
// refusing a name given twice and a missing required column. Every later line is a row with as
// many fields as the header. Fields are split at commas and trimmed; a field may be quoted as a
// whole, but no field holds a comma or a quote (no trace of this kind has one).
//
// # Output
//
// A Writer writes a header line, {"block_size":B,"time_unit":"ms"}, then one line per request:
//
//	{"timestamp":5000,"input_length":472,"output_length":18,"hash_ids":[0],"session_id":"…"}
//
// with ⌈input_length / B⌉ hash ids from a counter that runs through the file, so that no two
// requests share a block: the traces carry lengths, not prompt content. session_id is written
// only for a request that has one.
//
// # Errors
//
// Every error about the input's content is a *RowError naming the line and, where one is to
// blame, the column; errors.Is(err, ErrBadInput) holds for it. Its message starts with the
// command's name, which the caller passes in, so the commands keep their own prefixes.
//
// Readers and Writers are owned by one goroutine each; nothing in the package is shared.
package tracecsv
