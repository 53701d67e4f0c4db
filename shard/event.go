package shard

import (
	"strings"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
)

// The event vocabulary lives in package kvevent, at the bottom of the module, so that codecs can
// speak it without linking the index. These short names are for this package's own code; other
// packages name kvevent.
type (
	Kind  = kvevent.Kind
	Tier  = kvevent.Tier
	Event = kvevent.Event
)

const (
	Stored  = kvevent.Stored
	Removed = kvevent.Removed
	Cleared = kvevent.Cleared

	Device   = kvevent.Device
	Host     = kvevent.Host
	Disk     = kvevent.Disk
	External = kvevent.External
)

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
	salt   string // the last cache salt copied
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
	if ev.Salt != "" {
		if ev.Salt != b.salt {
			b.salt = strings.Clone(ev.Salt)
		}
		e.Salt = b.salt
	}
	e.Hashes = appendArena(&b.hashes, ev.Hashes)
	if ev.Locals != nil {
		if e.Locals = appendArena(&b.hashes, ev.Locals); e.Locals == nil {
			e.Locals = []uint64{}
		}
	}
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
