package scoring

import "math/rand/v2"

// TieBreak is the rule that chooses among candidates of equal logit, the one place it is written:
// the smallest Tree, then a uniform draw among those equal in both, in worker order. Select uses it
// and so does the router's kv path, so that for the same random source both take the same worker.
//
// Offer the tied candidates in worker order with Add, call Draw, then offer them again in the same
// order to Take, which is true for the one chosen. The random source is drawn from only when
// several candidates are equal in tree too. The zero value is empty; a TieBreak belongs to one
// goroutine.
type TieBreak struct {
	best  int64 // smallest tree offered
	n     int   // candidates offered with tree best
	first int   // position of the first of them
	k     int   // after Draw: which of them Take reports, counting down
}

// Reset empties t, for a new set of ties.
func (t *TieBreak) Reset() { *t = TieBreak{} }

// Add offers the candidate at position pos with tree blocks.
func (t *TieBreak) Add(pos int, tree int64) {
	switch {
	case t.n == 0 || tree < t.best:
		t.best, t.n, t.first = tree, 1, pos
	case tree == t.best:
		t.n++
	}
}

// Draw decides among the candidates offered. When one has the smallest tree it returns its
// position and true, and nothing need be offered to Take; otherwise it draws one of them from rng
// (nil: the runtime's source) and returns false.
func (t *TieBreak) Draw(rng *rand.Rand) (pos int, only bool) {
	if t.n <= 1 {
		return t.first, true
	}
	t.k = intn(rng, t.n)
	return -1, false
}

// Take reports whether the candidate with tree blocks, offered again in the order of Add, is the
// one Draw chose.
func (t *TieBreak) Take(tree int64) bool {
	if tree != t.best {
		return false
	}
	t.k--
	return t.k == -1
}
