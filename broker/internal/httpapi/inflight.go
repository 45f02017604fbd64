package httpapi

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// DefaultMaxInflightBytes is the node-wide bound on request body bytes held at once.
const DefaultMaxInflightBytes = 256 << 20

// bodyLimit is the most body an operation may send.
func bodyLimit(oi *opInfo) int64 {
	if oi != nil {
		switch oi.id {
		case "produce":
			return MaxPayloadBytes + 1 // the handler reports 413 past the payload limit
		case "produceBatch", "ackBatch":
			return MaxBatchBodyBytes
		}
	}
	return MaxAdminBodyBytes
}

// bodyBudget bounds the request body bytes the node holds at once. A body is read into
// memory whole and kept (with what is decoded from it) until the request ends, which
// for a write is after its fsync: while the disk is slow, every connection holds up to
// one 8 MiB batch body, and about three times that with its decoded payloads. Without a
// bound, many connections exhaust the node's memory; with one, the excess is refused
// with 503 and Retry-After and the clients back off.
//
// A request takes its Content-Length (or, without one, its operation's limit) before
// its body is read, and gives it back when it ends. One request is always let in when
// nothing else holds the budget, so a bound below the largest body still serves.
type bodyBudget struct {
	max     int64 // 0: no bound
	metrics *broker.Metrics

	mu   sync.Mutex
	used int64
}

func newBodyBudget(max int64, m *broker.Metrics) *bodyBudget {
	return &bodyBudget{max: max, metrics: m}
}

// need is what a request takes from the budget: nothing without a body.
func (b *bodyBudget) need(r *http.Request, oi *opInfo) int64 {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return 0
	}
	limit := bodyLimit(oi)
	if r.ContentLength < 0 || r.ContentLength > limit {
		return limit // chunked: at most the limit is read; over it: refused unread (413)
	}
	return r.ContentLength
}

// take reserves n bytes, or reports that the budget is spent.
func (b *bodyBudget) take(n int64) bool {
	if n == 0 {
		return true
	}
	b.mu.Lock()
	if b.max > 0 && b.used > 0 && b.used+n > b.max {
		b.mu.Unlock()
		if b.metrics != nil {
			b.metrics.BodiesRefused.Inc()
		}
		return false
	}
	b.used += n
	b.show()
	b.mu.Unlock()
	return true
}

// give returns n bytes taken by take.
func (b *bodyBudget) give(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.show()
	b.mu.Unlock()
}

// show sets the gauge; under mu, so it never shows an older value last.
func (b *bodyBudget) show() {
	if b.metrics != nil {
		b.metrics.BodyBytesInFlight.Set(float64(b.used))
	}
}

func (b *bodyBudget) overloaded() *apiError {
	return &apiError{status: http.StatusServiceUnavailable, code: apigen.ErrorCodeOverloaded, retryAfter: 1,
		msg: "the node holds its limit of " + strconv.FormatInt(b.max, 10) + " bytes of request bodies (--max-inflight-bytes), nothing of this request was read or stored; retry after Retry-After seconds, or send smaller requests"}
}
