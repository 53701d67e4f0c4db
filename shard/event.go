package shard

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/radix"
)

// Kind is what a KV event reports.
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

// Tier is the storage tier a block lives in. The index scores device (GPU) residency; events
// about other tiers are counted and skipped, so that an offloaded copy being dropped never
// removes the device copy with the same engine hash.
type Tier uint8

const (
	Device Tier = iota
	Host
	Disk
	External
)

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
// to a Tier; "" is the device.
func ParseMedium(s string) (Tier, bool) {
	switch strings.ToUpper(s) {
	case "", "GPU", "DEVICE":
		return Device, true
	case "CPU", "CPU_PINNED", "CPU_TIER1", "HOST", "HOST_PINNED":
		return Host, true
	case "CPU_TIER2", "DISK", "NVME":
		return Disk, true
	case "EXTERNAL", "NETWORK", "REMOTE", "SHARED":
		return External, true
	}
	return 0, false
}

// Event is one KV event of one worker, as the engines publish them (decoders fill it).
// Values are plain data, safe to copy; Batch.Add copies what the slices hold.
type Event struct {
	Kind Kind
	// ID numbers the events of one (worker, rank) from 1 upwards; 0 means unnumbered and is not
	// checked for gaps or duplicates.
	ID   uint64
	Rank uint32 // data-parallel rank
	Tier Tier

	// Hashes are the engine's block hashes (Stored, Removed): opaque ids that later removals use.
	Hashes []uint64

	// Stored only.
	Parent    uint64     // engine hash of the block before the first one, if HasParent
	HasParent bool       // false: the first block is the root of its chain
	BlockSize int        // tokens per block as the publisher states it; 0 = not stated
	Tokens    []uint32   // len(Hashes) × block size token ids
	LoRA      string     // adapter name, "" for the base model
	MM        [][]uint64 // MM[i]: multimodal object hashes of block i; nil when none
}

// Batch carries events of one worker of one model to its shard. Get one from Set.NewBatch, fill
// it with Add, hand it to Set.Enqueue; the shard recycles it. One goroutine at a time, and none
// after Enqueue.
type Batch struct {
	Index  *radix.Index
	Worker uint64
	// Applied, if set, is increased by the number of events once they are applied.
	Applied *atomic.Int64

	events []Event
	// Arenas the events' slices point into. A slice taken before an arena grew keeps the old
	// backing array, which holds the data it had: nothing is rewritten.
	hashes []uint64
	tokens []uint32
	mm     [][]uint64
	mmData []uint64
	lora   string // the last adapter name copied
}

// Add appends a copy of ev; ev's slices and string may be reused once Add returns.
func (b *Batch) Add(ev *Event) {
	e := *ev
	if ev.LoRA != "" {
		// Batches of one worker name few adapters: copy a name only when it changes.
		if ev.LoRA != b.lora {
			b.lora = strings.Clone(ev.LoRA)
		}
		e.LoRA = b.lora
	}
	e.Hashes = appendArena(&b.hashes, ev.Hashes)
	e.Tokens = appendArena(&b.tokens, ev.Tokens)
	if ev.MM != nil {
		n := len(b.mm)
		for _, x := range ev.MM {
			b.mm = append(b.mm, appendArena(&b.mmData, x))
		}
		e.MM = b.mm[n:len(b.mm):len(b.mm)]
	}
	b.events = append(b.events, e)
}

// maxKeptArena bounds what a recycled batch keeps of its arenas, so that one huge batch does
// not pin its memory in the free list.
const maxKeptArena = 1 << 20

func (b *Batch) reset() {
	b.Index, b.Worker, b.Applied = nil, 0, nil
	clear(b.events) // drop LoRA strings and slices for the GC
	b.events = b.events[:0]
	b.hashes, b.tokens, b.mmData = b.hashes[:0], b.tokens[:0], b.mmData[:0]
	clear(b.mm)
	b.mm = b.mm[:0]
	if cap(b.tokens) > maxKeptArena || cap(b.hashes) > maxKeptArena {
		*b = Batch{}
	}
}

func appendArena[T any](arena *[]T, x []T) []T {
	if x == nil {
		return nil
	}
	n := len(*arena)
	*arena = append(*arena, x...)
	return (*arena)[n:len(*arena):len(*arena)]
}
