// Package freelist keeps reusable values for hot paths. Unlike sync.Pool it is not emptied by
// the garbage collector: a request's scratch for 1,000 workers is about 100 KB, which sync.Pool
// drops within two collections, after which requests allocate it again; and under -race
// sync.Pool drops items at random, while a List keeps allocation tests meaningful.
package freelist

// List holds up to a fixed number of spare *T. Safe for concurrent use.
type List[T any] struct {
	c chan *T
}

// New returns a List keeping at most n spares.
func New[T any](n int) *List[T] {
	return &List[T]{c: make(chan *T, n)}
}

// Get returns a spare or a new zero T.
func (l *List[T]) Get() *T {
	select {
	case v := <-l.c:
		return v
	default:
		return new(T)
	}
}

// Put keeps v for reuse, or drops it when the list is full.
func (l *List[T]) Put(v *T) {
	select {
	case l.c <- v:
	default:
	}
}
