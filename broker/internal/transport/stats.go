package transport

import "sync/atomic"

// Stats is a snapshot of the node plane's counters, for metrics and tests. Counters
// only grow; Conns and RaftStreams are current values.
type Stats struct {
	// Conns is the number of authenticated connections open now.
	Conns int
	// RaftStreams is the number of raft streams open now, both directions.
	RaftStreams int
	// MessageStreams is the number of message streams open now, both directions;
	// MessagesServed counts the messages they brought to a handler.
	MessageStreams int
	MessagesServed uint64
	// Dials counts outgoing connection attempts; DialFailures those that failed.
	Dials        uint64
	DialFailures uint64
	// AuthFailures counts handshakes where a proof did not verify, on either side.
	AuthFailures uint64
	// HandshakeErrors counts handshakes that failed otherwise: timeout, malformed hello,
	// unsupported version, a peer with this node's own id.
	HandshakeErrors uint64
	// HandshakesRefused counts connections closed at once because
	// Options.MaxPendingHandshakes handshakes were already in progress.
	HandshakesRefused uint64
	// RequestsServed counts requests handed to a handler.
	RequestsServed uint64
	// RequestsRefused counts requests answered with an error without a handler run:
	// unknown op or kind, unsupported version, too large, busy, malformed.
	RequestsRefused uint64
}

type counters struct {
	dials, dialFailures             atomic.Uint64
	authFailures, handshakeErrors   atomic.Uint64
	handshakesRefused               atomic.Uint64
	requestsServed, requestsRefused atomic.Uint64
	raftStreams, msgStreams         atomic.Int64
	messagesServed                  atomic.Uint64
}
