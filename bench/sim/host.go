package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// The KV geometry and links the simulator's costs are derived from. The timing model is
// Dynamo's mocker fit, whose magnitude (≈ 15 µs per prefill token, ≈ 66 k tokens/s) is that of
// an 8B dense model on one H100-class GPU; the KV bytes per token are those of that model
// class, so that a block's transfer costs what it would in the deployment the step times
// stand for.
const (
	// KVBytesPerToken is the KV cache of one token of Llama-3.1-8B in bf16: 32 layers × 8 KV
	// heads × 128 dims × 2 (K and V) × 2 bytes = 131,072 B. Dynamo's mocker uses the same
	// figure in its KV-offload and handoff tests (kv_bytes_per_token 131072).
	KVBytesPerToken = 131072
	// HostBandwidth is the host→device copy rate of a reload, in bytes/s: 14 GB/s, the G2→G1
	// (host→GPU) onboard bandwidth Dynamo's mocker simulates KVBM with by default
	// (lib/mocker/src/kvbm_offload/config.rs), about a quarter of a PCIe 5.0 ×16 link's
	// 64 GB/s peak: pinned copies of many 128 KiB per-layer slices, sharing the link with the
	// engine's other traffic, run well below peak, and a slower link is the conservative side
	// for a host tier's benefit.
	HostBandwidth = 14e9
)

// HostReloadTime is the time to copy one block of blockSize tokens of bytesPerToken KV bytes
// from host memory to the device at bandwidth bytes/s, rounded to the nanosecond. With the
// defaults (64 tokens, KVBytesPerToken, HostBandwidth): 64 × 131,072 B = 8 MiB per block, /
// 14 GB/s = 599.186 µs. A recompute of the same 64 tokens costs at least the prefill model's
// linear term, 64 × 15.18 µs = 972 µs (plus the step's fixed and quadratic parts): a reload
// costs between a device hit (0) and a recompute.
func HostReloadTime(blockSize int, bytesPerToken, bandwidth float64) time.Duration {
	if blockSize <= 0 || !(bandwidth > 0) {
		return 0
	}
	return time.Duration(math.Round(float64(blockSize) * bytesPerToken / bandwidth * 1e9))
}

// hostTier is a worker's host-memory copy of blocks evicted from its device cache: an LRU of
// fixed capacity in blocks, keyed by engine hash, holding what a Stored event of the host tier
// needs (the parent and the block's local hash). Nodes live in a slab addressed by index.
type hostTier struct {
	cap        int
	idx        map[uint64]int32
	nodes      []hostNode
	free       []int32
	head, tail int32 // least recently used at the head
	n          int
}

type hostNode struct {
	hash, parent, local uint64
	hasParent           bool
	prev, next          int32
}

func newHostTier(capacity int) *hostTier {
	h := &hostTier{cap: capacity, idx: make(map[uint64]int32, capacity), nodes: make([]hostNode, capacity),
		free: make([]int32, capacity), head: none, tail: none}
	for i := range h.free {
		h.free[i] = int32(capacity - 1 - i)
	}
	return h
}

func (h *hostTier) has(hash uint64) bool { _, ok := h.idx[hash]; return ok }

func (h *hostTier) unlink(i int32) {
	n := &h.nodes[i]
	if n.prev == none {
		h.head = n.next
	} else {
		h.nodes[n.prev].next = n.next
	}
	if n.next == none {
		h.tail = n.prev
	} else {
		h.nodes[n.next].prev = n.prev
	}
	n.prev, n.next = none, none
	h.n--
}

func (h *hostTier) pushTail(i int32) {
	n := &h.nodes[i]
	n.prev, n.next = h.tail, none
	if h.tail == none {
		h.head = i
	} else {
		h.nodes[h.tail].next = i
	}
	h.tail = i
	h.n++
}

// touch makes hash the most recently used host block, if the tier holds it.
func (h *hostTier) touch(hash uint64) bool {
	i, ok := h.idx[hash]
	if ok {
		h.unlink(i)
		h.pushTail(i)
	}
	return ok
}

// offload copies an evicted device block into the host tier, as KVBM and LMCache keep a host
// copy of what the GPU drops: a block the tier holds already becomes its most recently used; a
// new one evicts the least recently used block when the tier is full (a Removed event of the
// host tier) and is published as Stored in the host tier. The events come before the device's
// Removed event for the block, so that the router never loses sight of a block that moves.
func (w *Worker) offload(blk *block) {
	h := w.host
	if h.touch(blk.hash) {
		return
	}
	if len(h.free) == 0 {
		old := h.head
		h.unlink(old)
		on := &h.nodes[old]
		delete(h.idx, on.hash)
		w.recordRemovedTier(on.hash, kvevent.Host)
		w.st.HostEvictedBlocks++
		h.free = append(h.free, old)
	}
	i := h.free[len(h.free)-1]
	h.free = h.free[:len(h.free)-1]
	h.nodes[i] = hostNode{hash: blk.hash, parent: blk.parent, local: blk.local, hasParent: blk.hasParent, prev: none, next: none}
	h.idx[blk.hash] = i
	h.pushTail(i)
	w.recordHostStored(blk.hash, blk.parent, blk.hasParent, blk.local)
	w.st.HostStoredBlocks++
}

// HostBlocks returns the number of blocks the worker's host tier holds (0 without one).
func (w *Worker) HostBlocks() int {
	if w.host == nil {
		return 0
	}
	return len(w.host.idx)
}

// checkHost verifies the host tier's invariants.
func (w *Worker) checkHost() error {
	h := w.host
	if h == nil {
		return nil
	}
	n, prev := 0, none
	for i := h.head; i != none; i = h.nodes[i].next {
		if h.nodes[i].prev != prev {
			return fmt.Errorf("host LRU link broken at %d", i)
		}
		if h.idx[h.nodes[i].hash] != i {
			return fmt.Errorf("host block %d not indexed", i)
		}
		prev = i
		n++
	}
	if n != h.n || prev != h.tail || n != len(h.idx) || n+len(h.free) != h.cap {
		return fmt.Errorf("host tier: %d linked, %d counted, %d indexed, %d free, capacity %d", n, h.n, len(h.idx), len(h.free), h.cap)
	}
	return nil
}
