package load

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
)

// IDSize is the number of payload bytes that carry the message id (big-endian uint64).
const IDSize = 8

const (
	chunkBits = 16
	chunkSize = 1 << chunkBits
	maxChunks = 1 << 15 // 2^31 ids, far beyond any phase

	confirmedBit = 1 << 31
	countMask    = confirmedBit - 1
)

// Tracker follows every message of one phase by id: whether its produce was confirmed
// and how many times it was delivered. Each id owns one uint32 in fixed-size chunks
// allocated as ids are handed out (4 bytes per message, no map, no lock on the hot
// path): the top bit says "confirmed", the rest counts deliveries.
//
// Confirm and Deliver race freely for the same id (a consumer may see a message before
// its producer read the 202); both are a single atomic operation on the same word, so
// exactly one of them observes the moment an id becomes confirmed-and-delivered, which
// keeps Covered exact while the phase runs.
type Tracker struct {
	next      atomic.Uint64
	mu        sync.Mutex // allocates chunks
	chunks    [maxChunks]atomic.Pointer[[chunkSize]uint32]
	confirmed atomic.Int64
	covered   atomic.Int64
	foreign   atomic.Int64
}

// Reserve hands out n consecutive ids and returns the first.
func (t *Tracker) Reserve(n int) uint64 {
	end := t.next.Add(uint64(n))
	first := end - uint64(n)
	for c := first >> chunkBits; c <= (end-1)>>chunkBits && c < maxChunks; c++ {
		if t.chunks[c].Load() == nil {
			t.mu.Lock()
			if t.chunks[c].Load() == nil {
				t.chunks[c].Store(new([chunkSize]uint32))
			}
			t.mu.Unlock()
		}
	}
	return first
}

func (t *Tracker) slot(id uint64) *uint32 {
	if id >= t.next.Load() || id>>chunkBits >= maxChunks {
		return nil
	}
	c := t.chunks[id>>chunkBits].Load()
	if c == nil {
		return nil
	}
	return &c[id&(chunkSize-1)]
}

// Confirm records that the broker confirmed the produce of id.
func (t *Tracker) Confirm(id uint64) {
	s := t.slot(id)
	if s == nil {
		return
	}
	old := atomic.OrUint32(s, confirmedBit)
	if old&confirmedBit != 0 {
		return
	}
	t.confirmed.Add(1)
	if old&countMask > 0 {
		t.covered.Add(1)
	}
}

// Deliver records one delivery of the message whose payload is given and returns its
// id; ok is false for a payload that carries no id of this phase (counted as foreign).
func (t *Tracker) Deliver(payload []byte) (id uint64, ok bool) {
	if len(payload) < IDSize {
		t.foreign.Add(1)
		return 0, false
	}
	id = binary.BigEndian.Uint64(payload)
	s := t.slot(id)
	if s == nil {
		t.foreign.Add(1)
		return 0, false
	}
	n := atomic.AddUint32(s, 1)
	if n&countMask == 1 && n&confirmedBit != 0 {
		t.covered.Add(1)
	}
	return id, true
}

// Confirmed is the number of ids whose produce was confirmed.
func (t *Tracker) Confirmed() int64 { return t.confirmed.Load() }

// Covered is the number of confirmed ids delivered at least once.
func (t *Tracker) Covered() int64 { return t.covered.Load() }

// AllDelivered reports whether every confirmed message was delivered at least once.
func (t *Tracker) AllDelivered() bool { return t.covered.Load() >= t.confirmed.Load() }

// Check is the account of one phase's messages.
type Check struct {
	Reserved    int64 `json:"reserved"`    // ids handed to producers
	Confirmed   int64 `json:"confirmed"`   // produce answered with success
	Delivered   int64 `json:"delivered"`   // distinct ids delivered at least once
	Lost        int64 `json:"lost"`        // confirmed, never delivered
	Duplicates  int64 `json:"duplicates"`  // ids delivered more than once
	Redelivered int64 `json:"redelivered"` // deliveries beyond the first, summed
	Unconfirmed int64 `json:"unconfirmed"` // delivered although their produce failed or was not answered
	Foreign     int64 `json:"foreign"`     // deliveries whose payload carries no id of this phase
}

// Check counts the phase's outcome. Call it once producers and consumers stopped.
func (t *Tracker) Check() Check {
	n := t.next.Load()
	c := Check{Reserved: int64(n), Foreign: t.foreign.Load()}
	for id := uint64(0); id < n; id++ {
		s := t.slot(id)
		if s == nil {
			continue
		}
		v := atomic.LoadUint32(s)
		count := int64(v & countMask)
		confirmed := v&confirmedBit != 0
		if confirmed {
			c.Confirmed++
		}
		switch {
		case count == 0 && confirmed:
			c.Lost++
		case count > 0 && !confirmed:
			c.Unconfirmed++
		}
		if count > 0 {
			c.Delivered++
		}
		if count > 1 {
			c.Duplicates++
			c.Redelivered += count - 1
		}
	}
	return c
}

// PutID writes id into the first IDSize bytes of payload.
func PutID(payload []byte, id uint64) { binary.BigEndian.PutUint64(payload, id) }
