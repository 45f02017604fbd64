package bufpool

import "testing"

// TestPool: a small buffer is kept by its owner, a large one goes to the pool and is
// lent to the next large write, and one over Drop goes nowhere.
func TestPool(t *testing.T) {
	p := &Pool{Keep: 64, Drop: 1024}
	small := make([]byte, 10, 64)
	if got := p.Release(small); cap(got) != 64 {
		t.Fatalf("a buffer of Keep bytes was not kept (cap %d)", cap(got))
	}
	if got := p.Take(small, 32); cap(got) != 64 || len(got) != 0 {
		t.Fatalf("Take with room enough: len %d cap %d; want the buffer itself, emptied", len(got), cap(got))
	}
	large := make([]byte, 500)
	if got := p.Release(large); got != nil {
		t.Fatal("a buffer over Keep was kept by its owner")
	}
	// sync.Pool may drop what it holds at any collection, so a Take may find nothing;
	// what it finds must be the pooled buffer, emptied, and a small need takes none.
	if got := p.Take(nil, 32); got != nil {
		t.Fatalf("a need under Keep took a pooled buffer (cap %d)", cap(got))
	}
	got := p.Take(nil, 400)
	if got != nil && (cap(got) != 500 || len(got) != 0) {
		t.Fatalf("a large need took a buffer of len %d cap %d; want the pooled one, emptied", len(got), cap(got))
	}
	if got := p.Release(make([]byte, 2048)); got != nil {
		t.Fatal("a buffer over Drop was kept by its owner")
	}
	if got := p.Take(nil, 2000); got != nil && cap(got) == 2048 {
		t.Fatal("a buffer over Drop went to the pool")
	}
}
