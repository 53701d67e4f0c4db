// Package kvevent is the vocabulary every layer of kvrouterd speaks: a worker's KV events, their
// kinds, the storage tiers blocks live in, and a (worker, rank)'s state as snapshots carry it.
//
// It sits at the bottom of the module and imports nothing of the project, so that a package
// which only encodes or decodes events (wire, and through it a gateway's client) links no index,
// applier or prefetcher code. Package shard gives these types their meaning (it applies events to
// the index) and re-declares them under their old names.
//
// Every type here is a plain value: safe to copy, with no methods that mutate, and safe for any
// number of goroutines to read at once as long as none writes the slices it points to.
package kvevent

import (
	"fmt"
	"strings"
)

// Kind is what a KV event reports. A plain value.
type Kind uint8

const (
	// Stored: blocks entered the worker's cache, chained onto Parent (or at the root).
	Stored Kind = iota + 1
	// Removed: blocks left the worker's cache.
	Removed
	// Cleared: the worker's whole cache was reset; clears every data-parallel rank of the worker.
	Cleared
)

func (k Kind) String() string {
	switch k {
	case Stored:
		return "stored"
	case Removed:
		return "removed"
	case Cleared:
		return "cleared"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Tier is the storage tier a block lives in; a plain value. Each tier is indexed on its own (an
// offloaded copy being dropped never removes the device copy with the same engine hash); a match
// extends a worker's device prefix through the lower tiers, Host first, then Disk, then External.
type Tier uint8

const (
	Device Tier = iota
	Host
	Disk
	External
)

// NumTiers is how many tiers there are; a Tier below it is valid.
const NumTiers = 4

func (t Tier) String() string {
	switch t {
	case Device:
		return "device"
	case Host:
		return "host"
	case Disk:
		return "disk"
	case External:
		return "external"
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// ParseMedium maps an engine's storage medium name (vLLM, SGLang, Dynamo spellings, any case)
// to a Tier; "" is the device. A name it does not know is the device too, as Dynamo reads it
// (an engine's new accelerator name must not drop its blocks), with ok false so that the caller
// can count it. Safe for concurrent use.
func ParseMedium(s string) (t Tier, ok bool) {
	switch strings.ToUpper(s) {
	case "", "GPU", "DEVICE":
		return Device, true
	case "CPU", "CPU_PINNED", "CPU_TIER1", "HOST", "HOST_PINNED":
		return Host, true
	case "CPU_TIER2", "DISK", "NVME", "STORAGE":
		return Disk, true
	case "EXTERNAL", "NETWORK", "REMOTE", "SHARED":
		return External, true
	}
	return Device, false
}

// Event is one KV event of one worker, as the engines publish them (decoders fill it).
// Values are plain data, safe to copy; shard.Batch.Add copies what the slices hold.
type Event struct {
	Kind Kind
	// ID numbers the events of one (worker, rank) from 1 upwards; 0 means unnumbered and is not
	// checked for gaps or duplicates.
	ID   uint64
	Rank uint32 // data-parallel rank
	Tier Tier
	// Batch is 1 + the publisher's batch sequence of the batch the event came in, for events
	// read straight from an engine's socket; 0 for none. The rank keeps the last one applied, so
	// that a restart resumes the engine's stream after it.
	Batch uint64

	// Hashes are the engine's block hashes (Stored, Removed): opaque ids that later removals use.
	Hashes []uint64

	// Stored only.
	Parent    uint64     // engine hash of the block before the first one, if HasParent
	HasParent bool       // false: the first block is the root of its chain
	BlockSize int        // tokens per block as the publisher states it; 0 = not stated
	Tokens    []uint32   // len(Hashes) × block size token ids
	LoRA      string     // adapter name, "" for the base model
	MM        [][]uint64 // MM[i]: multimodal object hashes of block i; nil when none
	// Salt is the request's cache salt (Dynamo's cache namespace), "" for none: it changes
	// every block's local hash as Dynamo's /query salts them.
	Salt string
	// Locals, when not nil, are the blocks' local hashes as Dynamo computes them (one per
	// block, its tokens_hash): the event carries these instead of Tokens, as a Dynamo
	// indexer's dump does.
	Locals []uint64
}

// RankState is one (worker, rank)'s state as a snapshot holds it: the last event id applied, the
// last engine batch applied (Event.Batch, 0 for none) and every block, Seqs[i] being the sequence
// hash of the block the engine calls Engines[i]. A plain value.
type RankState struct {
	Rank    uint32
	Cursor  uint64
	Batch   uint64
	Seqs    []uint64
	Engines []uint64
	// Locals and Parents, when not empty (one per block), are the block tree a router keeps
	// with --keep-block-tree: Locals[i] is the local hash of block Seqs[i], Parents[i] the
	// sequence hash of the block before it, or Seqs[i] itself for the root of a chain.
	Locals  []uint64
	Parents []uint64
	// Lower holds the rank's blocks in lower storage tiers (host, disk, external), each tier at
	// most once, none for a rank that holds nothing there; Seqs and Engines above are the
	// device tier's.
	Lower []TierBlocks
}

// TierBlocks are one (worker, rank)'s blocks in one lower storage tier, as RankState holds the
// device tier's: Seqs[i] is the sequence hash of the block the engine calls Engines[i] in that
// tier, with the block tree (Locals, Parents) when kept. A plain value.
type TierBlocks struct {
	Tier    Tier
	Seqs    []uint64
	Engines []uint64
	Locals  []uint64
	Parents []uint64
}
