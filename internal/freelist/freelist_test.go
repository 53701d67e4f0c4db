package freelist

import "testing"

func TestList(t *testing.T) {
	l := New[[]byte](2)
	a, b, c := l.Get(), l.Get(), l.Get()
	*a = append(*a, 1)
	l.Put(a)
	l.Put(b)
	l.Put(c) // dropped: the list keeps two
	if got := l.Get(); got != a || len(*got) != 1 {
		t.Fatal("Get did not return the first spare")
	}
	if got := l.Get(); got != b {
		t.Fatal("Get did not return the second spare")
	}
	if got := l.Get(); got == c {
		t.Fatal("a spare beyond the bound was kept")
	}
	if n := testing.AllocsPerRun(100, func() { l.Put(l.Get()) }); n != 0 {
		t.Fatalf("Get and Put allocate %v times", n)
	}
}
