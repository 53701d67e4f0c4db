package main

// The soak's prompts: a bounded set per model, each a shared document of docBlocks full blocks,
// then a question of its own of questionBlocks more, then a partial block. Two prompts of one
// document share their first docBlocks blocks, as conversations over one system prompt do, so
// that routes find cached prefixes on several workers. Token ids and the engine's block hashes
// are functions of (model, document, question, position), as an engine's content hashes are
// functions of the content: the same block of two prompts has the same engine hash.

const (
	blockSize      = 16
	docBlocks      = 16
	questionBlocks = 6
	tailTokens     = 5
	promptBlocks   = docBlocks + questionBlocks
	promptTokens   = promptBlocks*blockSize + tailTokens
)

// prompt names one prompt of the bounded set.
type prompt struct{ model, doc, question int }

// mix is SplitMix64's finalizer: distinct inputs, well-spread outputs.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// key is the content a position of the prompt depends on: the document alone before
// docBlocks, the question too after.
func (p prompt) key(pos int) uint64 {
	k := uint64(p.model)<<48 | uint64(p.doc)<<32 | uint64(pos)
	if pos >= docBlocks*blockSize {
		k |= uint64(p.question+1) << 40
	}
	return k
}

// tokens appends the prompt's token ids to dst.
func (p prompt) tokens(dst []uint32) []uint32 {
	for i := range promptTokens {
		dst = append(dst, uint32(mix(p.key(i))%32000)+1)
	}
	return dst
}

// blockHash is the engine's hash of full block i.
func (p prompt) blockHash(i int) uint64 {
	return mix(p.key(i*blockSize) ^ 0x5bd1e995)
}
