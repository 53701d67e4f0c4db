package wire

import (
	"fmt"
	"math"
	"slices"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// SnapshotWorker is one worker's state in a snapshot (SPEC.md §11): its registration and, per
// data-parallel rank, the event cursor and every block it holds as (sequence hash, engine hash)
// pairs. A snapshot's content is a run of these messages. For one goroutine at a time:
// decoding into it reuses its memory, and the decoded strings alias the decoded buffer (valid
// while it is unchanged).
type SnapshotWorker struct {
	ID        uint64
	Model     string
	BlockSize int
	Capacity  int64 // KV capacity in blocks, 0 = unknown
	MaxTokens int64 // max batched tokens, 0 = unknown
	// Endpoint and Replay are the worker's KV-event sockets as snapshots before per-rank
	// endpoints held them: its first rank's, a later rank r ranks after it on their port + r.
	// Writers leave them empty and fill Endpoints.
	Endpoint string
	Replay   string
	Reports  bool // the worker sends load reports (subject to the worker timeout)
	// HTTPEndpoint is the worker's OpenAI-compatible API, "" for none (flags bit 3).
	HTTPEndpoint string
	// APIKey is the key the front door sends the worker's API, "" for none (flags bit 7).
	APIKey string
	// Weight is the worker's weight for mode device_aware_weighted, 0 for none (flags bit 4).
	Weight float64
	// Role is the worker's role, 0 for both (an aggregated worker), 1 prefill, 2 decode
	// (router.Role's values; flags bit 5).
	Role  uint8
	Ranks []SnapshotRank
	// Endpoints, if not empty, holds one entry per rank, in the order of Ranks: where each
	// publishes its KV events (flags bit 1, which also carries each rank's Batch; without it,
	// Batch is written and read as 0).
	Endpoints []SnapshotEndpoint

	u64s []uint64 // the arena the decoded ranks' Seqs, Engines, Locals and Parents point into
	ns   []int    // per decoded rank: its blocks, then its tree's (0 or the same), then per lower tier the same pair
	nl   []int    // per decoded rank: its lower tiers
}

// SnapshotEndpoint is where one data-parallel rank publishes its KV events: its PUB socket and its
// replay socket, "" for none.
type SnapshotEndpoint struct {
	Endpoint, Replay string
}

// MaxRole is the highest SnapshotWorker.Role.
const MaxRole = 2

// MaxSnapshotRanks is the most data-parallel ranks a SnapshotWorker may carry.
const MaxSnapshotRanks = 1024

// SnapshotRank is one (worker, rank)'s blocks, as package shard exports and imports them:
// Seqs[i] is the router's sequence hash of the block the engine calls Engines[i]. Writers sort by
// Seqs so that workers holding the same blocks write the same bytes, which the snapshot's
// compression then stores once.
type SnapshotRank = kvevent.RankState

const (
	snapWorkerFixed = 32 // id, block_size, flags, capacity, max_tokens
	snapRankFixed   = 16 // rank, n_blocks, cursor
	snapReports     = 1 << 0
	snapEndpoints   = 1 << 1 // each rank carries its endpoints and its last engine batch
	snapTree        = 1 << 2 // each rank carries its block tree (local hashes and parents)
	snapHTTP        = 1 << 3 // the worker's HTTP endpoint follows the replay endpoint
	snapWeight      = 1 << 4 // the worker's weight (f64) follows the HTTP endpoint's place
	snapRole        = 1 << 5 // the worker's role (u32) follows the weight's place
	snapTiers       = 1 << 6 // each rank carries its blocks in the lower storage tiers
	snapAPIKey      = 1 << 7 // the worker's API key follows the role's place
	snapFlags       = snapReports | snapEndpoints | snapTree | snapHTTP | snapWeight | snapRole | snapTiers | snapAPIKey
)

var (
	snapWorkerLayout = [...]field{{"id", 8}, {"block_size", 4}, {"flags", 4}, {"capacity", 8}, {"max_tokens", 8}}
	snapRankLayout   = [...]field{{"rank", 4}, {"n_blocks", 4}, {"cursor", 8}}
	snapBatchLayout  = [...]field{{"batch", 8}}
)

// Validate reports the first field of w the format cannot carry (Offset -1).
func (w *SnapshotWorker) Validate() error {
	const m = "snapshot worker"
	for _, f := range [...]struct{ name, v string }{{"model", w.Model}, {"endpoint", w.Endpoint}, {"replay", w.Replay}, {"http_endpoint", w.HTTPEndpoint}, {"api_key", w.APIKey}} {
		if err := validStr(m, f.name, f.v); err != nil {
			return err
		}
	}
	if len(w.Endpoints) != 0 && len(w.Endpoints) != len(w.Ranks) {
		return invalid(m, "endpoints", ErrInvalid, fmt.Sprintf("%d for %d ranks", len(w.Endpoints), len(w.Ranks)))
	}
	for i, e := range w.Endpoints {
		for _, f := range [...]struct{ name, v string }{{"endpoint", e.Endpoint}, {"replay", e.Replay}} {
			if err := validStr(m, fmt.Sprintf("ranks[%d].%s", i, f.name), f.v); err != nil {
				return err
			}
		}
	}
	if len(w.Ranks) > MaxSnapshotRanks {
		return invalid(m, "n_ranks", ErrTooLong, fmt.Sprintf("%d ranks, max %d", len(w.Ranks), MaxSnapshotRanks))
	}
	if w.Model == "" {
		return invalid(m, "model", ErrInvalid, "must not be empty")
	}
	if w.Weight != 0 && (!(w.Weight > 0) || math.IsInf(w.Weight, 1)) {
		return invalid(m, "weight", ErrInvalid, fmt.Sprintf("%v, want 0 (none) or a finite number > 0", w.Weight))
	}
	if w.Role > MaxRole {
		return invalid(m, "role", ErrInvalid, fmt.Sprintf("%d, want 0 (both), 1 (prefill) or 2 (decode)", w.Role))
	}
	if w.BlockSize <= 0 || w.BlockSize > MaxBlockSize {
		return invalid(m, "block_size", ErrInvalid, fmt.Sprintf("%d, want 1 to %d", w.BlockSize, MaxBlockSize))
	}
	for i := range w.Ranks {
		r := &w.Ranks[i]
		if len(r.Seqs) != len(r.Engines) {
			return invalid(m, fmt.Sprintf("ranks[%d].engines", i), ErrInvalid,
				fmt.Sprintf("%d engine hashes for %d sequence hashes", len(r.Engines), len(r.Seqs)))
		} else if len(r.Locals) != len(r.Parents) || len(r.Locals) != 0 && len(r.Locals) != len(r.Seqs) {
			return invalid(m, fmt.Sprintf("ranks[%d].n_tree", i), ErrInvalid,
				fmt.Sprintf("%d local hashes and %d parents for %d blocks", len(r.Locals), len(r.Parents), len(r.Seqs)))
		}
		var seen [kvevent.NumTiers]bool
		for j := range r.Lower {
			l := &r.Lower[j]
			f := fmt.Sprintf("ranks[%d].lower[%d]", i, j)
			switch {
			case l.Tier == kvevent.Device || l.Tier >= kvevent.NumTiers || seen[l.Tier]:
				return invalid(m, f+".tier", ErrInvalid, fmt.Sprintf("tier %d: want 1 to 3, each once", l.Tier))
			case len(l.Seqs) != len(l.Engines):
				return invalid(m, f+".engines", ErrInvalid, fmt.Sprintf("%d engine hashes for %d sequence hashes", len(l.Engines), len(l.Seqs)))
			case len(l.Locals) != len(l.Parents) || len(l.Locals) != 0 && len(l.Locals) != len(l.Seqs):
				return invalid(m, f+".n_tree", ErrInvalid, fmt.Sprintf("%d local hashes and %d parents for %d blocks", len(l.Locals), len(l.Parents), len(l.Seqs)))
			}
			seen[l.Tier] = true
		}
	}
	if size := w.size(); size > 1<<32-1 {
		return invalid(m, "body_length", ErrTooLong, fmt.Sprintf("%d bytes, max 2^32-1", size))
	}
	return nil
}

func (w *SnapshotWorker) size() int {
	n := snapWorkerFixed + strSize(w.Model) + strSize(w.Endpoint) + strSize(w.Replay) + 4
	if w.HTTPEndpoint != "" {
		n += strSize(w.HTTPEndpoint)
	}
	if w.Weight != 0 {
		n += 8
	}
	if w.Role != 0 {
		n += 4
	}
	if w.APIKey != "" {
		n += strSize(w.APIKey)
	}
	tree, tiers := w.hasTree(), w.hasTiers()
	for i := range w.Ranks {
		n += snapRankFixed + 16*len(w.Ranks[i].Seqs)
		if tree {
			n += 4 + 16*len(w.Ranks[i].Locals)
		}
		if tiers {
			n += 4
			for _, l := range w.Ranks[i].Lower {
				n += 8 + 16*len(l.Seqs)
				if tree {
					n += 4 + 16*len(l.Locals)
				}
			}
		}
	}
	for _, e := range w.Endpoints {
		n += strSize(e.Endpoint) + strSize(e.Replay) + 8
	}
	return n
}

// hasTree reports whether a rank of w carries its block tree (flags bit 2).
func (w *SnapshotWorker) hasTree() bool {
	for i := range w.Ranks {
		if len(w.Ranks[i].Locals) != 0 {
			return true
		}
		for _, l := range w.Ranks[i].Lower {
			if len(l.Locals) != 0 {
				return true
			}
		}
	}
	return false
}

// hasTiers reports whether a rank of w holds blocks in a lower storage tier (flags bit 6).
func (w *SnapshotWorker) hasTiers() bool {
	for i := range w.Ranks {
		if len(w.Ranks[i].Lower) != 0 {
			return true
		}
	}
	return false
}

// AppendSnapshotWorker appends w as one message. Call Validate first: what it refuses is
// written so that decoding fails rather than silently changed.
func AppendSnapshotWorker(dst []byte, w *SnapshotWorker) []byte {
	body := w.size()
	dst = slices.Grow(dst, HeaderSize+body)
	dst = appendHeader(dst, TypeSnapshotWorker, body)
	dst = le.AppendUint64(dst, w.ID)
	dst = le.AppendUint32(dst, uint32(w.BlockSize))
	var flags uint32
	if w.Reports {
		flags |= snapReports
	}
	if len(w.Endpoints) > 0 {
		flags |= snapEndpoints
	}
	tree := w.hasTree()
	if tree {
		flags |= snapTree
	}
	if w.HTTPEndpoint != "" {
		flags |= snapHTTP
	}
	if w.Weight != 0 {
		flags |= snapWeight
	}
	if w.Role != 0 {
		flags |= snapRole
	}
	tiers := w.hasTiers()
	if tiers {
		flags |= snapTiers
	}
	if w.APIKey != "" {
		flags |= snapAPIKey
	}
	dst = le.AppendUint32(dst, flags)
	dst = le.AppendUint64(dst, uint64(w.Capacity))
	dst = le.AppendUint64(dst, uint64(w.MaxTokens))
	dst = appendStr(dst, w.Model)
	dst = appendStr(dst, w.Endpoint)
	dst = appendStr(dst, w.Replay)
	if w.HTTPEndpoint != "" {
		dst = appendStr(dst, w.HTTPEndpoint)
	}
	if w.Weight != 0 {
		dst = le.AppendUint64(dst, math.Float64bits(w.Weight))
	}
	if w.Role != 0 {
		dst = le.AppendUint32(dst, uint32(w.Role))
	}
	if w.APIKey != "" {
		dst = appendStr(dst, w.APIKey)
	}
	dst = appendCount(dst, len(w.Ranks))
	for i := range w.Ranks {
		r := &w.Ranks[i]
		dst = le.AppendUint32(dst, r.Rank)
		dst = appendCount(dst, len(r.Seqs))
		dst = le.AppendUint64(dst, r.Cursor)
		if len(w.Endpoints) > 0 {
			dst = appendStr(dst, w.Endpoints[i].Endpoint)
			dst = appendStr(dst, w.Endpoints[i].Replay)
			dst = le.AppendUint64(dst, r.Batch)
		}
		dst = appendHashes(dst, r.Seqs)
		dst = appendHashes(dst, r.Engines[:len(r.Seqs)])
		if tree {
			dst = appendCount(dst, len(r.Locals))
			dst = appendHashes(dst, r.Locals)
			dst = appendHashes(dst, r.Parents[:len(r.Locals)])
		}
		if tiers {
			dst = appendCount(dst, len(r.Lower))
			for j := range r.Lower {
				l := &r.Lower[j]
				dst = le.AppendUint32(dst, uint32(l.Tier))
				dst = appendCount(dst, len(l.Seqs))
				dst = appendHashes(dst, l.Seqs)
				dst = appendHashes(dst, l.Engines[:len(l.Seqs)])
				if tree {
					dst = appendCount(dst, len(l.Locals))
					dst = appendHashes(dst, l.Locals)
					dst = appendHashes(dst, l.Parents[:len(l.Locals)])
				}
			}
		}
	}
	return dst
}

// DecodeSnapshotWorker decodes the one message b holds into w.
func DecodeSnapshotWorker(b []byte, w *SnapshotWorker) error {
	d := newDecoder(b, "snapshot worker")
	if err := d.header(TypeSnapshotWorker); err != nil {
		return err
	}
	p, err := d.fixed(snapWorkerLayout[:], snapWorkerFixed)
	if err != nil {
		return err
	}
	base := d.off - snapWorkerFixed
	bs := le.Uint32(p[8:])
	if bs == 0 || bs > MaxBlockSize {
		return d.errAt("block_size", base+8, ErrInvalid, "%d, want 1 to %d", bs, MaxBlockSize)
	}
	flags := le.Uint32(p[12:])
	if flags&^snapFlags != 0 {
		return d.errAt("flags", base+12, ErrInvalid, "unknown bits %#x", flags&^snapFlags)
	}
	capacity, maxTokens := int64(le.Uint64(p[16:])), int64(le.Uint64(p[24:]))
	if capacity < 0 || maxTokens < 0 {
		field, off := "capacity", base+16
		if capacity >= 0 {
			field, off = "max_tokens", base+24
		}
		return d.errAt(field, off, ErrInvalid, "negative")
	}
	model, err := d.str("model")
	if err != nil {
		return err
	}
	if model == "" {
		return d.errAt("model", d.off-2, ErrInvalid, "must not be empty")
	}
	endpoint, err := d.str("endpoint")
	if err != nil {
		return err
	}
	replay, err := d.str("replay")
	if err != nil {
		return err
	}
	var httpEndpoint string
	if flags&snapHTTP != 0 {
		if httpEndpoint, err = d.str("http_endpoint"); err != nil {
			return err
		}
	}
	var weight float64
	if flags&snapWeight != 0 {
		bits, err := d.u64("weight")
		if err != nil {
			return err
		}
		weight = math.Float64frombits(bits)
		if !(weight > 0) || math.IsInf(weight, 1) {
			return d.errAt("weight", d.off-8, ErrInvalid, "%v, want a finite number > 0", weight)
		}
	}
	var role uint32
	if flags&snapRole != 0 {
		if role, err = d.u32("role"); err != nil {
			return err
		}
		if role == 0 || role > MaxRole {
			return d.errAt("role", d.off-4, ErrInvalid, "%d, want 1 (prefill) or 2 (decode): a worker of both roles clears flags bit 5", role)
		}
	}
	var apiKey string
	if flags&snapAPIKey != 0 {
		if apiKey, err = d.str("api_key"); err != nil {
			return err
		}
		if apiKey == "" {
			return d.errAt("api_key", d.off-2, ErrInvalid, "empty: a worker without a key clears flags bit 7")
		}
	}
	start := d.off
	nr, err := d.count("n_ranks", "ranks", snapRankFixed)
	if err != nil {
		return err
	}
	if nr > MaxSnapshotRanks {
		return d.errAt("n_ranks", start, ErrTooLong, "%d ranks, max %d", nr, MaxSnapshotRanks)
	}
	w.Ranks = slices.Grow(w.Ranks[:0], nr)[:nr]
	w.Endpoints = w.Endpoints[:0]
	w.u64s, w.ns, w.nl = w.u64s[:0], w.ns[:0], w.nl[:0]
	for i := range nr {
		q, err := d.fixed(snapRankLayout[:], snapRankFixed)
		if err != nil {
			return err
		}
		rank, batch := le.Uint32(q), uint64(0)
		for j := range i {
			if w.Ranks[j].Rank == rank {
				return d.errAt(fmt.Sprintf("ranks[%d].rank", i), d.off-snapRankFixed, ErrInvalid, "rank %d twice", rank)
			}
		}
		if flags&snapEndpoints != 0 {
			var e SnapshotEndpoint
			if e.Endpoint, err = d.str(fmt.Sprintf("ranks[%d].endpoint", i)); err != nil {
				return err
			}
			if e.Replay, err = d.str(fmt.Sprintf("ranks[%d].replay", i)); err != nil {
				return err
			}
			w.Endpoints = append(w.Endpoints, e)
			b, err := d.fixed(snapBatchLayout[:], 8)
			if err != nil {
				return err
			}
			batch = le.Uint64(b)
		}
		n, err := d.fits(fmt.Sprintf("ranks[%d].n_blocks", i), "blocks", le.Uint32(q[4:]), 16)
		if err != nil {
			return err
		}
		w.u64s = appendU64s(w.u64s, d.take(16*n)) // its seqs, then its engine hashes
		w.Ranks[i] = SnapshotRank{Rank: rank, Cursor: le.Uint64(q[8:]), Batch: batch}
		nt := 0
		if flags&snapTree != 0 {
			at := d.off
			if nt, err = d.count(fmt.Sprintf("ranks[%d].n_tree", i), "tree", 16); err != nil {
				return err
			}
			if nt != 0 && nt != n {
				return d.errAt(fmt.Sprintf("ranks[%d].n_tree", i), at, ErrInvalid, "%d, want 0 or n_blocks (%d)", nt, n)
			}
			w.u64s = appendU64s(w.u64s, d.take(16*nt)) // its local hashes, then its parents
		}
		w.ns = append(w.ns, n, nt)
		nl := 0
		if flags&snapTiers != 0 {
			if nl, err = w.decodeLower(&d, i, flags&snapTree != 0); err != nil {
				return err
			}
		}
		w.nl = append(w.nl, nl)
	}
	if flags&snapTiers != 0 && !slices.ContainsFunc(w.nl, func(n int) bool { return n != 0 }) {
		// The encoder sets the bit only for a worker with some rank's lower tier: one form
		// per worker.
		return d.errAt("flags", base+12, ErrInvalid, "bit 6 (lower tiers) set, but no rank has a lower tier")
	}
	// Point the ranks into the arena now that it has stopped growing.
	off, k := 0, 0
	for i := range w.Ranks {
		r := &w.Ranks[i]
		n, nt := w.ns[k], w.ns[k+1]
		k += 2
		r.Seqs, r.Engines, r.Locals, r.Parents, off = w.point(off, n, nt)
		r.Lower = r.Lower[:0]
		for range w.nl[i] {
			tier, n, nt := kvevent.Tier(w.ns[k]), w.ns[k+1], w.ns[k+2]
			k += 3
			var l kvevent.TierBlocks
			l.Tier = tier
			l.Seqs, l.Engines, l.Locals, l.Parents, off = w.point(off, n, nt)
			r.Lower = append(r.Lower, l)
		}
		if len(r.Lower) == 0 {
			r.Lower = nil
		}
	}
	if err := d.end(); err != nil {
		return err
	}
	w.ID, w.BlockSize, w.Reports = le.Uint64(p), int(bs), flags&snapReports != 0
	w.Capacity, w.MaxTokens, w.Model, w.Endpoint, w.Replay = capacity, maxTokens, model, endpoint, replay
	w.HTTPEndpoint, w.Weight, w.Role, w.APIKey = httpEndpoint, weight, uint8(role), apiKey
	return nil
}

// point returns the arena's next n sequence hashes, n engine hashes, and nt local hashes and
// parents (nil for none), and the offset after them.
func (w *SnapshotWorker) point(off, n, nt int) (seqs, engines, locals, parents []uint64, next int) {
	seqs = w.u64s[off : off+n : off+n]
	engines = w.u64s[off+n : off+2*n : off+2*n]
	off += 2 * n
	if nt != 0 {
		locals = w.u64s[off : off+nt : off+nt]
		parents = w.u64s[off+nt : off+2*nt : off+2*nt]
		off += 2 * nt
	}
	return seqs, engines, locals, parents, off
}

// decodeLower decodes rank i's lower tiers (flags bit 6) into the arena, noting each tier's
// number, blocks and tree in w.ns, and returns how many there are.
func (w *SnapshotWorker) decodeLower(d *decoder, i int, tree bool) (int, error) {
	nl, err := d.count(fmt.Sprintf("ranks[%d].n_lower", i), "lower tiers", 8)
	if err != nil {
		return 0, err
	}
	var seen [kvevent.NumTiers]bool
	for j := range nl {
		f := fmt.Sprintf("ranks[%d].lower[%d]", i, j)
		at := d.off
		t, err := d.u32(f + ".tier")
		if err != nil {
			return 0, err
		}
		if t == 0 || t >= kvevent.NumTiers || seen[t] {
			return 0, d.errAt(f+".tier", at, ErrInvalid, "tier %d: want 1 to 3, each once per rank", t)
		}
		seen[t] = true
		n, err := d.count(f+".n_blocks", "blocks", 16)
		if err != nil {
			return 0, err
		}
		w.u64s = appendU64s(w.u64s, d.take(16*n))
		nt := 0
		if tree {
			at := d.off
			if nt, err = d.count(f+".n_tree", "tree", 16); err != nil {
				return 0, err
			}
			if nt != 0 && nt != n {
				return 0, d.errAt(f+".n_tree", at, ErrInvalid, "%d, want 0 or n_blocks (%d)", nt, n)
			}
			w.u64s = appendU64s(w.u64s, d.take(16*nt))
		}
		w.ns = append(w.ns, int(t), n, nt)
	}
	return nl, nil
}
