package freelist

import "testing"

func TestList(t *testing.T) {
	l := New[[]byte]()
	a := l.Get()
	if a == nil || *a != nil {
		t.Fatalf("Get of an empty list: %v, want a new zero value", a)
	}
	*a = append(*a, 1)
	l.Put(a)
	// What Get returns is a spare (any of them) or a new zero value, never nil.
	for range 100 {
		v := l.Get()
		if v == nil {
			t.Fatal("Get returned nil")
		}
		if v != a && *v != nil {
			t.Fatalf("Get returned %v: neither the spare nor a zero value", *v)
		}
		l.Put(v)
	}
	if raceEnabled {
		t.Skip("allocation counts need a build without -race")
	}
	if n := testing.AllocsPerRun(100, func() { l.Put(l.Get()) }); n != 0 {
		t.Fatalf("Get and Put allocate %v times", n)
	}
}
