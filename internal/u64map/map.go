// Package u64map is an open-addressing map from uint64 to uint64 that allocates only to grow.
package u64map

import (
	"math/bits"
	"unsafe"

	"github.com/kvrouterd/kvrouterd/internal/prefetch"
)

// Map is a map from uint64 to uint64 for hot paths: a worker's engine block hashes to the
// router's sequence hashes (package shard, where it is the largest per-residency cost after the
// index), a worker's active blocks to their request counts (package scoring). A compact
// open-addressing table:
// 16-byte slots, Robin Hood linear probing with backward-shift deletion (no tombstones, so a
// steady stream of stores and removals never rehashes), fast range reduction so that the size
// can grow by 3/2 instead of 2. Key 0 marks an empty slot, so a real key 0 is kept aside.
//
// A Map is not safe for concurrent use: its owner serializes access. The zero value is an empty
// map.
type Map struct {
	slots   []emSlot
	n       int // keys in slots (the zero key not counted)
	maxN    int
	hasZero bool
	zeroVal uint64
}

type emSlot struct{ k, v uint64 }

const (
	emMin                = 8
	emLoadNum, emLoadDen = 7, 8 // grow past 7/8 full
	emGrowNum, emGrowDen = 3, 2
)

func (m *Map) Len() int {
	if m.hasZero {
		return m.n + 1
	}
	return m.n
}

func (m *Map) home(k uint64) int {
	hi, _ := bits.Mul64(k*0x9e3779b97f4a7c15, uint64(len(m.slots)))
	return int(hi)
}

// dist is how far position i is from the home of key k.
func (m *Map) dist(k uint64, i int) int {
	d := i - m.home(k)
	if d < 0 {
		d += len(m.slots)
	}
	return d
}

// Cap is the number of slots: At's range.
func (m *Map) Cap() int { return len(m.slots) }

// At returns the key and value in slot i (0 ≤ i < Cap), ok false for an empty slot. The zero
// key, kept aside, is in no slot. For looking at the map from any slot on (an eviction's
// random start).
func (m *Map) At(i int) (k, v uint64, ok bool) {
	s := m.slots[i]
	return s.k, s.v, s.k != 0
}

// prefetch starts loading the home slots of keys, which the caller is about to look up.
func (m *Map) Prefetch(keys []uint64) {
	if len(m.slots) == 0 {
		return
	}
	var ps [32]unsafe.Pointer
	for len(keys) > 0 {
		n := min(len(keys), len(ps))
		for j, k := range keys[:n] {
			ps[j] = unsafe.Pointer(&m.slots[m.home(k)])
		}
		prefetch.Lines(ps[:n])
		keys = keys[n:]
	}
}

// find returns the position of k, or -1.
func (m *Map) find(k uint64) int {
	if len(m.slots) == 0 {
		return -1
	}
	for i, d := m.home(k), 0; ; d++ {
		s := &m.slots[i]
		if s.k == k {
			return i
		}
		// Robin Hood: k would have displaced any key closer to its home than d.
		if s.k == 0 || m.dist(s.k, i) < d {
			return -1
		}
		if i++; i == len(m.slots) {
			i = 0
		}
	}
}

func (m *Map) Get(k uint64) (uint64, bool) {
	if k == 0 {
		return m.zeroVal, m.hasZero
	}
	if i := m.find(k); i >= 0 {
		return m.slots[i].v, true
	}
	return 0, false
}

// put sets k to v.
func (m *Map) Put(k, v uint64) {
	if k == 0 {
		m.hasZero, m.zeroVal = true, v
		return
	}
	if i := m.find(k); i >= 0 {
		m.slots[i].v = v
		return
	}
	if m.n >= m.maxN {
		m.resize(max(len(m.slots)*emGrowNum/emGrowDen, emMin))
	}
	m.insert(k, v)
	m.n++
}

// Build fills an empty map with keys[i] → vals[i], at the capacity Grow(len(keys)) gives, in
// one pass: the keys are ordered by their home slot and laid down in that order, which is the
// layout Robin Hood insertion reaches, without its displacements. It reports false, leaving the
// map empty, if a key repeats or the map is not empty. scratch, if large enough, is used for
// the ordering (it needs len(keys) + capacity + 1 ints) and returned for reuse.
func (m *Map) Build(keys, vals []uint64, scratch []int32) ([]int32, bool) {
	if m.Len() != 0 || len(vals) != len(keys) {
		return scratch, false
	}
	m.Grow(len(keys))
	c := len(m.slots)
	if c == 0 {
		return scratch, true
	}
	need := len(keys) + c + 1
	if cap(scratch) < need {
		scratch = make([]int32, need)
	}
	scratch = scratch[:need]
	order, start := scratch[:len(keys)], scratch[len(keys):]
	clear(start)
	for _, k := range keys {
		if k != 0 {
			start[m.home(k)+1]++
		}
	}
	for i := range c {
		start[i+1] += start[i]
	}
	for i, k := range keys {
		if k != 0 {
			h := m.home(k)
			order[start[h]] = int32(i)
			start[h]++
		}
	}
	placed := int(start[c-1]) // keys other than 0, all ordered
	var wrapped []int32
	next := 0          // the first free slot at or after the current home
	group, gh := 0, -1 // where in order the keys of home gh begin
	for o, i := range order[:placed] {
		k := keys[i]
		h := m.home(k)
		if h != gh {
			group, gh = o, h
		}
		// An equal key has the same home: it is among the group's keys before it.
		for _, j := range order[group:o] {
			if keys[j] == k {
				m.Reset()
				return scratch, false
			}
		}
		pos := max(h, next)
		if pos >= c {
			wrapped = append(wrapped, i)
			next = pos + 1
			continue
		}
		m.slots[pos] = emSlot{k, vals[i]}
		next = pos + 1
	}
	m.n = placed - len(wrapped)
	for _, i := range wrapped { // past the end: Robin Hood insertion from slot 0 on
		m.insert(keys[i], vals[i])
		m.n++
	}
	for i, k := range keys {
		if k == 0 {
			if m.hasZero {
				m.Reset()
				return scratch, false
			}
			m.hasZero, m.zeroVal = true, vals[i]
		}
	}
	return scratch, true
}

// insert places a key known to be absent, displacing keys nearer their home.
func (m *Map) insert(k, v uint64) {
	for i, d := m.home(k), 0; ; d++ {
		s := &m.slots[i]
		if s.k == 0 {
			s.k, s.v = k, v
			return
		}
		if sd := m.dist(s.k, i); sd < d {
			s.k, k = k, s.k
			s.v, v = v, s.v
			d = sd
		}
		if i++; i == len(m.slots) {
			i = 0
		}
	}
}

// Del removes k and returns its value.
func (m *Map) Del(k uint64) (uint64, bool) {
	if k == 0 {
		v, ok := m.zeroVal, m.hasZero
		m.hasZero, m.zeroVal = false, 0
		return v, ok
	}
	i := m.find(k)
	if i < 0 {
		return 0, false
	}
	v := m.slots[i].v
	m.delAt(i)
	return v, true
}

// Ref adds 1 to the value of k, an absent k counting as 0, and reports whether k was absent:
// Get and Put in one probe, for maps of reference counts.
func (m *Map) Ref(k uint64) (added bool) {
	if k == 0 {
		added = !m.hasZero
		m.hasZero = true
		m.zeroVal++
		return added
	}
	if i := m.find(k); i >= 0 {
		m.slots[i].v++
		return false
	}
	if m.n >= m.maxN {
		m.resize(max(len(m.slots)*emGrowNum/emGrowDen, emMin))
	}
	m.insert(k, 1)
	m.n++
	return true
}

// Unref subtracts 1 from the value of k and removes k when that leaves 0 or less, reporting
// whether it removed it. An absent k is left absent and reported removed.
func (m *Map) Unref(k uint64) (removed bool) {
	if k == 0 {
		if m.zeroVal <= 1 {
			m.hasZero, m.zeroVal = false, 0
			return true
		}
		m.zeroVal--
		return false
	}
	i := m.find(k)
	if i < 0 {
		return true
	}
	if m.slots[i].v > 1 {
		m.slots[i].v--
		return false
	}
	m.delAt(i)
	return true
}

// delAt removes the key at position i: it shifts the following run back by one until a key
// sits at its home or a slot is empty.
func (m *Map) delAt(i int) {
	for {
		j := i + 1
		if j == len(m.slots) {
			j = 0
		}
		s := m.slots[j]
		if s.k == 0 || m.dist(s.k, j) == 0 {
			break
		}
		m.slots[i] = s
		i = j
	}
	m.slots[i] = emSlot{}
	m.n--
}

// Grow makes room for n more keys, so that adding them does not resize the map (one
// allocation, one rehash of what is there, instead of a chain of them: a bulk load).
func (m *Map) Grow(n int) {
	need := m.n + n
	if need <= m.maxN {
		return
	}
	c := max(len(m.slots), emMin)
	for c*emLoadNum/emLoadDen < need {
		c = c * emGrowNum / emGrowDen
	}
	m.resize(c)
}

func (m *Map) resize(c int) {
	old := m.slots
	m.slots = make([]emSlot, c)
	m.maxN = c * emLoadNum / emLoadDen
	for _, s := range old {
		if s.k != 0 {
			m.insert(s.k, s.v)
		}
	}
}

// each calls f for every key and value.
func (m *Map) Each(f func(k, v uint64)) {
	if m.hasZero {
		f(0, m.zeroVal)
	}
	for _, s := range m.slots {
		if s.k != 0 {
			f(s.k, s.v)
		}
	}
}

// reset empties the map. A large table is given back: a worker that was cleared refills over
// time, and its old size would be held for nothing if it does not.
func (m *Map) Reset() {
	m.n, m.hasZero, m.zeroVal = 0, false, 0
	if len(m.slots) > 1024 {
		m.slots, m.maxN = nil, 0
		return
	}
	clear(m.slots)
}
