package u64map

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// checkMap compares m with the builtin map and checks the Robin Hood invariant.
func checkMap(t *testing.T, m *Map, want map[uint64]uint64) {
	t.Helper()
	if m.Len() != len(want) {
		t.Fatalf("len %d, want %d", m.Len(), len(want))
	}
	for k, v := range want {
		if got, ok := m.Get(k); !ok || got != v {
			t.Fatalf("get(%d) = %d, %v; want %d", k, got, ok, v)
		}
	}
	n := 0
	m.Each(func(k, v uint64) {
		n++
		if want[k] != v {
			t.Fatalf("each gave %d=%d, want %d", k, v, want[k])
		}
	})
	if n != len(want) {
		t.Fatalf("each visited %d, want %d", n, len(want))
	}
	// Every key sits after a run of keys at least as far from home as it is, one step back.
	for i, s := range m.slots {
		if s.k == 0 {
			continue
		}
		if d := m.dist(s.k, i); d > 0 {
			j := i - 1
			if j < 0 {
				j = len(m.slots) - 1
			}
			if p := m.slots[j]; p.k == 0 || m.dist(p.k, j) < d-1 {
				t.Fatalf("slot %d: key %d at distance %d after a slot at distance < %d", i, s.k, d, d-1)
			}
		}
	}
}

// applyEngineOps drives an Map and the builtin map with ops decoded from data: 9 bytes per
// op (kind, key), keys folded to a small range so that ops collide.
func applyEngineOps(t *testing.T, data []byte, keyRange uint64) {
	var m Map
	want := map[uint64]uint64{}
	for i := 0; len(data) >= 9; i++ {
		op, k := data[0], binary.LittleEndian.Uint64(data[1:9])%keyRange
		data = data[9:]
		switch op % 6 { // 255 % 6 == 3
		case 0, 1:
			m.Put(k, uint64(i))
			want[k] = uint64(i)
		case 2:
			v, ok := m.Del(k)
			wv, wok := want[k]
			if ok != wok || v != wv {
				t.Fatalf("del(%d) = %d, %v; want %d, %v", k, v, ok, wv, wok)
			}
			delete(want, k)
		case 3:
			if op == 255 {
				m.Reset()
				clear(want)
			}
		case 4:
			_, had := want[k]
			if added := m.Ref(k); added == had {
				t.Fatalf("ref(%d) = added %v, but it was present: %v", k, added, had)
			}
			want[k]++
		case 5:
			v, had := want[k]
			if removed := m.Unref(k); removed != (v <= 1) {
				t.Fatalf("unref(%d) of %d (present %v) = removed %v", k, v, had, removed)
			}
			if v <= 1 {
				delete(want, k)
			} else {
				want[k] = v - 1
			}
		}
	}
	checkMap(t, &m, want)
}

func TestMapRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, keyRange := range []uint64{4, 100, 5000, 1 << 40} {
		data := make([]byte, 9*20000)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		applyEngineOps(t, data, keyRange)
	}
}

func TestMapGrowsAndShrinks(t *testing.T) {
	var m Map
	want := map[uint64]uint64{}
	for k := range uint64(5000) {
		m.Put(k, k*3) // includes key 0, kept aside
		want[k] = k * 3
	}
	checkMap(t, &m, want)
	for k := uint64(0); k < 5000; k += 2 {
		m.Del(k)
		delete(want, k)
	}
	checkMap(t, &m, want)
	m.Reset()
	if m.Len() != 0 || m.slots != nil {
		t.Fatalf("reset of a large map kept %d keys, %d slots", m.Len(), len(m.slots))
	}
}

// A steady churn of puts and deletes never allocates: no tombstones to rehash.
func TestMapChurnAllocs(t *testing.T) {
	var m Map
	for k := range uint64(1000) {
		m.Put(k+1, k)
	}
	k := uint64(1)
	if n := testing.AllocsPerRun(10000, func() {
		m.Del(k)
		m.Put(k+1000, k)
		k++
	}); n != 0 {
		t.Fatalf("%v allocs per churn step, want 0", n)
	}
}

func FuzzMap(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Add(make([]byte, 9*40))
	f.Fuzz(func(t *testing.T, data []byte) {
		applyEngineOps(t, data, 64)
	})
}

func TestGrow(t *testing.T) {
	var m Map
	m.Grow(1000)
	slots := len(m.slots)
	for k := uint64(1); k <= 1000; k++ {
		m.Put(k, k*2)
	}
	if len(m.slots) != slots {
		t.Fatalf("Put resized after Grow(1000): %d slots, then %d", slots, len(m.slots))
	}
	m.Grow(10) // room already
	if len(m.slots) != slots {
		t.Fatal("Grow with room to spare resized")
	}
	m.Grow(5000)
	for k := uint64(1); k <= 1000; k++ {
		if v, ok := m.Get(k); !ok || v != k*2 {
			t.Fatalf("key %d after Grow: %d %v", k, v, ok)
		}
	}
}

// TestBuild: a map built in one pass holds what Puts give, with the Robin Hood layout (checkMap),
// at Grow's capacity, also when keys wrap past the table's end and with the zero key; a repeated
// key leaves it empty.
func TestBuild(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	var scratch []int32
	for _, n := range []int{0, 1, 7, 100, 10000, 33333} {
		keys, vals := make([]uint64, n), make([]uint64, n)
		want := map[uint64]uint64{}
		for i := range keys {
			k := r.Uint64()
			if i == 3 {
				k = 0
			}
			for _, dup := want[k]; dup; _, dup = want[k] {
				k = r.Uint64()
			}
			keys[i], vals[i] = k, uint64(i)
			want[k] = uint64(i)
		}
		var m, g Map
		var ok bool
		if scratch, ok = m.Build(keys, vals, scratch); !ok {
			t.Fatalf("%d keys: refused", n)
		}
		checkMap(t, &m, want)
		g.Grow(n)
		if len(m.slots) != len(g.slots) {
			t.Fatalf("%d keys: %d slots, Grow gives %d", n, len(m.slots), len(g.slots))
		}
		// It goes on as any map.
		m.Put(12345, 1)
		want[12345] = 1
		checkMap(t, &m, want)
		if n > 1 {
			keys[n-1] = keys[0]
			var d Map
			if _, ok := d.Build(keys, vals, nil); ok || d.Len() != 0 {
				t.Fatalf("%d keys with a repeat: built %v, %d keys", n, ok, d.Len())
			}
		}
	}
	// Keys whose homes are the last slots wrap to the start.
	var m Map
	m.Grow(64)
	c := len(m.slots)
	var keys, vals []uint64
	want := map[uint64]uint64{}
	for k := uint64(1); len(keys) < 40; k++ {
		if m.home(k) >= c-4 {
			keys, vals = append(keys, k), append(vals, k)
			want[k] = k
		}
	}
	var w Map
	if _, ok := w.Build(keys, vals, nil); !ok {
		t.Fatal("wrapping keys refused")
	}
	checkMap(t, &w, want)
}
