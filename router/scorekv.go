package router

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
)

// This file is the route of the usual gateway call: mode kv, temperature 0, every worker a
// candidate. It does not score every worker one by one, yet answers as the general path does, to
// the bit: the same choice, the same candidates in the same order with the same numbers, and the
// same random draw when the cheapest workers tie (TestScoreKVMatchesGeneral).
//
//   - An idle worker (no request booked) costs a function of its cached depth alone, read from a
//     per-request table; a capped answer keeps only the limit cheapest idle workers.
//   - The busy workers are the tracker's busy bitmap. For a capped answer, a busy worker's shared
//     active blocks, which cost a lock and a search, are looked up only if its cost with every
//     possible block shared could reach the answer.
//   - The tree sizes that break ties are read for the tied and the answered workers only.
//   - An answer with every worker is written in one pass, straight into the encoded message
//     (AppendRoute) or into resp.Candidates; the same pass finds the idle workers that tie for
//     the choice, and the chosen worker goes into the message's head after it.
//
// Under concurrent bookings a busy worker's load is read at one moment and its shared blocks at
// another, as on the general path; the bound that skips the lookup uses the load read first.

// busyRow is a busy worker: its candidate, exact once shared blocks are looked up.
type busyRow struct {
	pos    int32
	exact  bool
	booked int64 // blocks booked on the worker, decayed ones included: what a request may share
	c      scoring.Candidate
}

// ranked is a worker in the running for the answer: its logit and list position.
type ranked struct {
	logit float64
	pos   int32
}

func (a ranked) before(b ranked) bool {
	return a.logit < b.logit || a.logit == b.logit && a.pos < b.pos
}

// compare orders by (logit, position), for slices.SortFunc.
func (a ranked) compare(b ranked) int {
	switch {
	case a.before(b):
		return -1
	case b.before(a):
		return 1
	}
	return 0
}

// maxCostTable bounds the per-request table of idle costs by depth; deeper prompts compute the
// cost of the rest.
const maxCostTable = 4096

// cost is scoring.Params.Cost's answer for one worker.
type cost struct {
	prefill, decode int64
	logit           float64
}

// wireCost is an idle worker's cost as its record carries it: wireCandidate's conversions of
// cost, made once per depth rather than once per worker.
type wireCost struct {
	prefill, active uint32
	logit           float64
}

// idleCost is the cost of a worker with depth cached blocks and nothing booked.
func idleCost(p *scoring.Params, depth int32) cost {
	prefill, decode, logit := p.Cost(depth, 0, 0, 0, 0)
	return cost{prefill, decode, logit}
}

// scoreKV scores the workers of list for a request of s.seqs whose index match is s.m, and fills
// resp with the chosen worker (if book) and the candidates: every worker in list order, or if 0 <
// limit < workers, the chosen one and then the cheapest, limit in all. It returns the chosen
// worker's list position and cached depth (-1, 0 without book), and whether it wrote the answer
// to *enc instead of resp.Candidates: with enc not nil, an answer with every worker is appended
// to *enc encoded, and resp gets the rest. list must not be empty.
func (s *scratch) scoreKV(r *Router, ix *radix.Index, list *workerList, p *scoring.Params, req *wire.RouteRequest, resp *wire.RouteResponse, limit int, book bool, enc *[]byte) (pos, cached int32, encoded bool) {
	n := len(list.keys)
	all := limit <= 0 || limit >= n
	depth := slices.Grow(s.depth[:0], n)[:n] // cached depth by position; ^depth for a busy worker
	deepest := spread(depth, s.m.Slots, s.m.Depth, list.bySlot)
	s.depth = depth

	s.busy = r.tracker.AppendBusy(s.busy[:0])
	bpos := s.bpos[:0]
	for _, slot := range s.busy {
		if int(slot) >= len(list.byActive) {
			break // ascending: the rest are other models' workers
		}
		if pos := list.byActive[slot]; pos >= 0 {
			bpos = append(bpos, pos)
		}
	}
	slices.Sort(bpos)
	s.bpos = bpos
	rows := s.rows[:0]
	for _, pos := range bpos {
		l, k := list.loads[pos], list.keys[pos]
		active, booked := l.Blocks()
		rows = append(rows, busyRow{pos: pos, booked: booked, c: scoring.Candidate{
			Worker: k.ID, Rank: k.Rank, Cached: depth[pos],
			ActiveBlocks: active, ActivePrefill: s.activePrefill(l, p), ActiveRequests: l.Requests(), Pending: l.Pending(),
			Slow: l.SlownessStep(),
		}})
		depth[pos] = ^depth[pos]
	}
	s.rows = rows
	if p.Formula == scoring.CostTTFT {
		// Score's Backlog over every worker: the idle ones have none.
		var sum int64
		for i := range rows {
			sum += max(rows[i].c.Pending, 0)
		}
		p.Backlog = scoring.BacklogOf(sum, n)
	}
	if p.NeedsMinPrefill() {
		// The least active prefill among the candidates: an idle worker's 0, if there is one.
		p.MinActivePrefill = 0
		if len(rows) == n {
			p.MinActivePrefill = math.MaxInt64
			for i := range rows {
				p.MinActivePrefill = min(p.MinActivePrefill, rows[i].c.ActivePrefill)
			}
		}
	}

	// An idle worker's cost by its depth, to the deepest depth any worker has.
	nt := min(int(deepest)+1, maxCostTable)
	tab := slices.Grow(s.tab[:0], nt)[:nt]
	wtab := slices.Grow(s.wtab[:0], nt)[:nt]
	v1 := p.Formula == scoring.CostV1 // CostV1 inlines; Cost does not
	if v1 {
		for d := range tab {
			var c cost
			c.prefill, c.decode, c.logit = p.CostV1(int32(d), 0, 0, 0)
			tab[d], wtab[d] = c, wireCost{clampU32(c.prefill), clampU32(c.decode), c.logit}
		}
	} else {
		// A formula that costs more than a few operations is computed for the depths idle
		// workers have only; the loops below read no other.
		have := slices.Grow(s.have[:0], nt)[:nt]
		clear(have)
		for _, d := range depth {
			if d >= 0 && int(d) < nt && !have[d] {
				c := idleCost(p, d)
				tab[d], wtab[d], have[d] = c, wireCost{clampU32(c.prefill), clampU32(c.decode), c.logit}, true
			}
		}
		s.have = have
	}
	s.tab, s.wtab = tab, wtab

	if all {
		return s.answerAll(r, ix, list, p, req, resp, book, enc)
	}

	// The limit cheapest idle workers, by (logit, position), in a max-heap. On the way, the idle
	// workers at the lowest logit so far, in position order: they tie for the choice.
	h, ties, lowest := cheapestIdle(depth, tab, p, limit, s.heap[:0], s.ties[:0])
	s.heap, s.ties = h, ties

	// bound is the limit-th lowest logit if no busy worker shared a block: no worker above it can
	// be chosen or answered.
	bounds := s.bounds[:0]
	for _, e := range h {
		bounds = append(bounds, e.logit)
	}
	for i := range rows {
		c := &rows[i].c
		var ub float64
		if v1 {
			_, _, ub = p.CostV1(c.Cached, 0, c.ActiveBlocks, c.ActivePrefill)
		} else {
			x := *c
			x.Shared = 0
			_, _, ub = p.CostAt(&x)
		}
		bounds = append(bounds, ub)
	}
	slices.Sort(bounds)
	s.bounds = bounds
	bound := math.Inf(1)
	if len(bounds) >= limit {
		bound = bounds[limit-1]
	}
	pool := append(s.pool[:0], h...)
	for i := range rows {
		if l, ok := s.exactBusy(r, list, p, &rows[i], bound); ok {
			pool = append(pool, ranked{l, rows[i].pos})
		}
	}
	slices.SortFunc(pool, ranked.compare)
	s.pool = pool

	chosen := int32(-1)
	if book {
		// The lowest logit: the pool's first, which holds the cheapest idle worker.
		low := lowest
		if len(pool) > 0 {
			low = min(low, pool[0].logit)
		}
		chosen = s.tied(ix, list, low, lowest, nil, r.cfg.Rand)
	}
	fillHeader(resp, req, p, book)
	if book {
		resp.Worker, resp.Rank = list.keys[chosen].ID, list.keys[chosen].Rank
	}
	s.fillCapped(resp, ix, list, p, chosen, limit)
	if chosen < 0 {
		return -1, 0, encoded
	}
	if d := depth[chosen]; d < 0 {
		return chosen, ^d, encoded
	}
	return chosen, depth[chosen], encoded
}

// exactBusy prices the busy worker row with its shared blocks looked up, unless even with every
// block it may share its logit would stay above bound; it returns the logit and whether it did.
func (s *scratch) exactBusy(r *Router, list *workerList, p *scoring.Params, row *busyRow, bound float64) (float64, bool) {
	c := &row.c
	most := int32(min(int64(p.Blocks), max(row.booked, 0)))
	if s.noReuse {
		most = 0 // nothing booked is shared: the bound is exact
	}
	var lb float64
	if p.Formula == scoring.CostV1 { // CostV1 inlines; Cost does not
		_, _, lb = p.CostV1(c.Cached, most, c.ActiveBlocks, c.ActivePrefill)
	} else {
		x := *c
		x.Shared = most
		_, _, lb = p.CostAt(&x)
	}
	if lb > bound {
		return 0, false
	}
	if !s.noReuse {
		c.Shared = int32(r.tracker.Shared(list.loads[row.pos], s.tseqs))
	}
	c.PrefillTokens, c.DecodeBlocks, c.Logit = p.CostAt(c)
	row.exact = true
	return c.Logit, true
}

// answerAll is scoreKV's answer with every worker: each busy worker priced exactly, then one pass
// that writes every candidate and, on the way, finds the idle workers at the lowest logit, which
// tie for the choice. The choice is made after that pass, so an encoded answer gets its chosen
// worker written into its head last.
func (s *scratch) answerAll(r *Router, ix *radix.Index, list *workerList, p *scoring.Params, req *wire.RouteRequest, resp *wire.RouteResponse,
	book bool, enc *[]byte) (pos, cached int32, encoded bool) {
	busyLow := math.Inf(1)
	for i := range s.rows {
		if l, _ := s.exactBusy(r, list, p, &s.rows[i], math.Inf(1)); l < busyLow {
			busyLow = l
		}
	}
	n := len(list.keys)
	fillHeader(resp, req, p, book)
	start := 0
	var lowest float64
	if enc != nil {
		start = len(*enc)
		var recs []byte
		*enc, recs = wire.AppendRouteResponseRecords(*enc, resp, n)
		s.fillTree(ix, list)
		lowest = s.fillRecs(recs, list, p)
	} else {
		resp.Candidates = slices.Grow(resp.Candidates, n)[:n]
		s.fillTree(ix, list)
		lowest = s.fillAll(resp.Candidates, list, p)
	}
	if !book {
		return -1, 0, enc != nil
	}
	chosen := s.tied(ix, list, min(lowest, busyLow), lowest, s.tree, r.cfg.Rand)
	resp.Worker, resp.Rank = list.keys[chosen].ID, list.keys[chosen].Rank
	if enc != nil {
		wire.PutRouteResponseWorker((*enc)[start:], resp.Worker, resp.Rank)
	}
	if d := s.depth[chosen]; d < 0 {
		return chosen, ^d, enc != nil
	}
	return chosen, s.depth[chosen], enc != nil
}

// cheapestIdle returns, among the idle workers of depth (busy ones are negative), the keep
// cheapest by (logit, position) as a max-heap appended to h, those at the lowest logit in
// position order appended to ties, and that logit. tab is the idle cost by depth, as deep as
// it goes.
func cheapestIdle(depth []int32, tab []cost, p *scoring.Params, keep int, h []ranked, ties []tie) ([]ranked, []tie, float64) {
	if len(tab) == maxCostTable {
		return cheapestIdleDeep(depth, tab, p, keep, h, ties)
	}
	// Every depth is in tab: a loop without a call, whose state stays in registers.
	lowest := math.Inf(1)
	for pos, d := range depth {
		if d < 0 {
			continue
		}
		l := tab[d].logit
		if l <= lowest {
			if l < lowest {
				lowest, ties = l, ties[:0]
			}
			ties = append(ties, tie{pos: int32(pos)})
		}
		if keep > 0 && (len(h) < keep || l < h[0].logit) {
			h = keepLowest(h, ranked{l, int32(pos)}, keep)
		}
	}
	return h, ties, lowest
}

// cheapestIdleDeep is cheapestIdle when some depths may lie beyond the table.
func cheapestIdleDeep(depth []int32, tab []cost, p *scoring.Params, keep int, h []ranked, ties []tie) ([]ranked, []tie, float64) {
	lowest := math.Inf(1)
	for pos, d := range depth {
		if d < 0 {
			continue
		}
		var l float64
		if int(d) < len(tab) {
			l = tab[d].logit
		} else {
			l = idleCost(p, d).logit
		}
		if l <= lowest {
			if l < lowest {
				lowest, ties = l, ties[:0]
			}
			ties = append(ties, tie{pos: int32(pos)})
		}
		// Positions ascend, so only a strictly lower logit displaces the top: checked here, as
		// most workers are not among the cheapest.
		if keep > 0 && (len(h) < keep || l < h[0].logit) {
			h = keepLowest(h, ranked{l, int32(pos)}, keep)
		}
	}
	return h, ties, lowest
}

// spread sets depth[pos] to the cached depth of the worker at list position pos (0 for a worker
// the match did not report), given the match's slots and depths and the list's slot→position
// map, and returns the deepest. A function of its own so that the loop keeps its slices in
// registers.
func spread(depth []int32, slots []radix.Slot, depths []int32, bySlot []int32) int32 {
	clear(depth)
	depths = depths[:len(slots)]
	deepest := int32(0)
	for i, slot := range slots {
		if int(slot) < len(bySlot) {
			if pos := bySlot[slot]; pos >= 0 && int(pos) < len(depth) {
				d := depths[i]
				depth[pos] = d
				deepest = max(deepest, d)
			}
		}
	}
	return deepest
}

// fillAll writes every worker's candidate, in list order, into out, its tree size read from
// s.tree (fillTree). On the way it puts the idle workers at the lowest logit of any idle worker
// into s.ties, in position order, and returns that logit (+Inf if no worker is idle). fillRecs
// does the same into an encoded answer: one record per worker, which is how a large answer
// stays one pass over memory.
func (s *scratch) fillAll(out []wire.Candidate, list *workerList, p *scoring.Params) float64 {
	rows, next := s.rows, 0
	ties := slices.Grow(s.ties[:0], len(s.depth))[:len(s.depth)]
	nt, lowest := 0, math.Inf(1)
	for pos, d := range s.depth {
		if d < 0 {
			c := &rows[next].c
			next++
			c.Tree = s.tree[pos]
			out[pos] = wireCandidate(c)
			continue
		}
		c := wireAt(s.wtab, p, d)
		k := &list.keys[pos]
		o := &out[pos]
		o.Worker, o.Rank, o.CachedBlocks, o.PrefillTokens, o.ActiveBlocks, o.TreeBlocks, o.Logit = k.ID, k.Rank, uint32(d), c.prefill, c.active, uint64(max(s.tree[pos], 0)), c.logit
		nt, lowest = noteTie(ties, nt, lowest, c.logit, pos)
	}
	s.ties = ties[:nt]
	return lowest
}

// fillTree sets s.tree to every worker's tree size, by position.
func (s *scratch) fillTree(ix *radix.Index, list *workerList) {
	n := len(list.keys)
	s.tree = slices.Grow(s.tree[:0], n)[:n]
	ix.FillBlocks(list.slots, s.tree)
}

// fillRecs is fillAll when the answer is encoded: each worker's record is written into recs (a
// record per worker, in position order). The busy workers' records are written first, then the
// idle workers' in a loop of their own (fillIdle) that calls nothing while every depth is in
// the cost table: a call or a growing append in the loop made the compiler keep its dozen
// variables on the stack, reloaded every iteration, which was most of the loop's cost.
func (s *scratch) fillRecs(recs []byte, list *workerList, p *scoring.Params) float64 {
	depth := s.depth
	n := len(depth)
	if len(recs) < n*wire.CandidateSize {
		panic("router: the answer has fewer records than workers")
	}
	recs = recs[:n*wire.CandidateSize]
	tree := s.tree[:n]
	for i := range s.rows {
		row := &s.rows[i]
		c := &row.c
		c.Tree = tree[row.pos]
		o := wireCandidate(c)
		wire.PutCandidate(recs[int(row.pos)*wire.CandidateSize:], o.Worker, o.Rank, o.CachedBlocks, o.PrefillTokens, o.ActiveBlocks, o.TreeBlocks, o.Logit)
	}
	ties := slices.Grow(s.ties[:0], n)[:n]
	if len(s.wtab) < maxCostTable {
		// Every depth is in the table (cheapestIdle's test).
		nt, lowest := fillIdle(recs, depth, list.keys[:n], tree, s.wtab, ties)
		s.ties = ties[:nt]
		return lowest
	}
	// Some depth lies beyond the table: wireAt computes those from p, a call per such worker.
	nt, lowest := 0, math.Inf(1)
	for pos, d := range depth {
		if d < 0 {
			continue
		}
		c := wireAt(s.wtab, p, d)
		k := &list.keys[pos]
		wire.PutCandidate(recs[pos*wire.CandidateSize:], k.ID, k.Rank, uint32(d), c.prefill, c.active, uint64(max(tree[pos], 0)), c.logit)
		nt, lowest = noteTie(ties, nt, lowest, c.logit, pos)
	}
	s.ties = ties[:nt]
	return lowest
}

// fillIdle writes the record of every idle worker (depth ≥ 0) at its position in recs, its
// cost read from wtab by its depth, which must hold every depth; it puts the idle workers at the
// lowest logit into ties (as long as depth), in position order, and returns how many and that
// logit (+Inf if none is idle).
func fillIdle(recs []byte, depth []int32, keys []radix.WorkerKey, tree []int64, wtab []wireCost, ties []tie) (int, float64) {
	keys, tree, ties = keys[:len(depth)], tree[:len(depth)], ties[:len(depth)]
	nt, lowest := 0, math.Inf(1)
	for pos, d := range depth {
		if d < 0 {
			continue
		}
		c := wtab[d]
		k := &keys[pos]
		rec := (*[wire.CandidateSize]byte)(recs[pos*wire.CandidateSize:])
		wire.PutCandidate(rec[:], k.ID, k.Rank, uint32(d), c.prefill, c.active, uint64(max(tree[pos], 0)), c.logit)
		nt, lowest = noteTie(ties, nt, lowest, c.logit, pos)
	}
	return nt, lowest
}

// noteTie takes in an idle worker at position pos and logit l, given the nt ties at lowest in
// ties (as long as the workers, so that nothing grows in the loops that call it): it joins them,
// or starts them anew below lowest. It returns the new count and lowest.
func noteTie(ties []tie, nt int, lowest, l float64, pos int) (int, float64) {
	if l <= lowest {
		if l < lowest {
			lowest, nt = l, 0
		}
		ties[nt] = tie{pos: int32(pos)}
		nt++
	}
	return nt, lowest
}

// wireAt is the record fields of an idle worker at depth d: wireCandidate's conversions (the
// differential test holds them to it), made once per depth in wtab, and by idleWire for a depth
// beyond it.
func wireAt(wtab []wireCost, p *scoring.Params, d int32) wireCost {
	if int(d) < len(wtab) {
		return wtab[d]
	}
	return idleWire(p, d)
}

// idleWire is wireAt beyond the table.
func idleWire(p *scoring.Params, d int32) wireCost {
	ic := idleCost(p, d)
	return wireCost{clampU32(ic.prefill), clampU32(ic.decode), ic.logit}
}

// fillCapped writes the chosen worker's candidate (if any) and then the cheapest others', limit
// in all.
func (s *scratch) fillCapped(resp *wire.RouteResponse, ix *radix.Index, list *workerList, p *scoring.Params, chosen int32, limit int) {
	if chosen >= 0 {
		resp.Candidates = s.appendAt(resp.Candidates, ix, list, p, chosen)
	}
	for _, e := range s.pool {
		if len(resp.Candidates) == limit {
			break
		}
		if e.pos != chosen {
			resp.Candidates = s.appendAt(resp.Candidates, ix, list, p, e.pos)
		}
	}
}

// tied returns the position of the worker Select would choose among those whose logit is
// lowest, by scoring.TieBreak over them in position order.
// s.ties holds the idle workers whose logit is idleLowest, the lowest of any idle worker. trees,
// if not nil, holds every worker's tree size by position, read already; else they are read here.
func (s *scratch) tied(ix *radix.Index, list *workerList, lowest, idleLowest float64, trees []int64, rng *rand.Rand) int32 {
	ties := s.ties
	if idleLowest != lowest {
		ties = ties[:0]
	}
	// Merge in the busy workers at the lowest logit (those left inexact are above it).
	idle := len(ties)
	for i := range s.rows {
		if row := &s.rows[i]; row.exact && row.c.Logit == lowest {
			ties = append(ties, tie{pos: row.pos})
		}
	}
	if idle > 0 && len(ties) > idle {
		slices.SortFunc(ties, func(a, b tie) int { return cmp.Compare(a.pos, b.pos) })
	}
	if s.eject && len(ties) > 1 {
		ties = loseTies(ties, list) // eject.go
	}
	s.ties = ties
	var tb scoring.TieBreak
	for i := range ties {
		var t int64
		if trees != nil {
			t = trees[ties[i].pos]
		} else {
			t = ix.Blocks(list.slots[ties[i].pos])
		}
		ties[i].tree = t
		tb.Add(i, t)
	}
	if i, only := tb.Draw(rng); only {
		return ties[i].pos
	}
	for _, t := range ties {
		if tb.Take(t.tree) {
			return t.pos
		}
	}
	panic("router: no worker at the lowest logit") // unreachable: the pool's first is one
}

type tie struct {
	pos  int32
	tree int64
}

// appendAt appends the candidate of list position pos, busy or idle.
func (s *scratch) appendAt(dst []wire.Candidate, ix *radix.Index, list *workerList, p *scoring.Params, pos int32) []wire.Candidate {
	var c scoring.Candidate
	if d := s.depth[pos]; d < 0 {
		i, _ := slices.BinarySearchFunc(s.rows, pos, func(r busyRow, pos int32) int { return cmp.Compare(r.pos, pos) })
		c = s.rows[i].c
	} else {
		k, ic := list.keys[pos], idleCost(p, d)
		c = scoring.Candidate{Worker: k.ID, Rank: k.Rank, Cached: d, PrefillTokens: ic.prefill, DecodeBlocks: ic.decode, Logit: ic.logit}
	}
	c.Tree = ix.Blocks(list.slots[pos])
	return appendCandidate(dst, &c)
}

// keepLowest adds e to h, a max-heap by (logit, position) of at most k entries: while h is
// full, e replaces the top only if it comes before it. O(log k).
func keepLowest(h []ranked, e ranked, k int) []ranked {
	switch {
	case len(h) < k:
		h = append(h, e)
		up(h, len(h)-1)
	case len(h) > 0 && e.before(h[0]):
		h[0] = e
		down(h, 0)
	}
	return h
}

// up and down keep h a max-heap by (logit, pos).
func up(h []ranked, j int) {
	for j > 0 {
		parent := (j - 1) / 2
		if !h[parent].before(h[j]) {
			return
		}
		h[j], h[parent] = h[parent], h[j]
		j = parent
	}
}

func down(h []ranked, i int) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && h[c].before(h[c+1]) {
			c++
		}
		if !h[i].before(h[c]) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// chosenCandidate returns the inputs scoreKV scored the worker at list position pos with: its
// busy row's (shared blocks looked up if they were), or an idle worker's, which has only its
// cached depth.
func (s *scratch) chosenCandidate(pos int32) scoring.Candidate {
	for i := range s.rows {
		if s.rows[i].pos == pos {
			return s.rows[i].c
		}
	}
	return scoring.Candidate{Cached: s.depth[pos]}
}
