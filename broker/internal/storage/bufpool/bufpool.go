// Package bufpool lends large write buffers between the logs of a process. A log
// that kept its largest write's buffer for its next write held that memory for as long
// as it was open, on every partition and Raft group of the node; a buffer over Keep
// bytes now goes back to a pool shared by every log once its write is done, and the
// garbage collector empties the pool when it goes unused.
package bufpool

import "sync"

// Pool holds buffers of more than Keep bytes; none larger than Drop (when Drop is
// not 0), which are let go instead: one huge write's buffer is worth keeping nowhere.
type Pool struct {
	Keep, Drop int
	p          sync.Pool // of *[]byte
}

// Take returns buf emptied, or a pooled buffer in its place when buf has less room
// than need and need is over Keep (the caller grows what it gets as before).
func (p *Pool) Take(buf []byte, need int) []byte {
	if cap(buf) < need && need > p.Keep {
		if b, ok := p.p.Get().(*[]byte); ok {
			return (*b)[:0]
		}
	}
	return buf[:0]
}

// Release returns what the caller keeps of buf for its next write: buf itself when
// it is at most Keep bytes, else nil, buf going back to the pool (or, over Drop, to
// the garbage collector). Nothing may hold buf's data after the call.
func (p *Pool) Release(buf []byte) []byte {
	switch c := cap(buf); {
	case c <= p.Keep:
		return buf
	case p.Drop == 0 || c <= p.Drop:
		b := buf[:0]
		p.p.Put(&b)
	}
	return nil
}
