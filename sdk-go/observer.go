package narad

import (
	"context"
	"time"
)

// EventKind says what an Event reports.
type EventKind int

// The kinds of Event.
const (
	// EventRequest is one HTTP attempt, successful or not.
	EventRequest EventKind = iota + 1
	// EventRetry is a decision to retry a call after a failed attempt.
	EventRetry
	// EventBreakerOpen is an endpoint taken out of the rotation after failures.
	EventBreakerOpen
	// EventBreakerClose is an endpoint back in the rotation after a successful probe.
	EventBreakerClose
	// EventProcess is a handler run of a Consumer, with its outcome in Err.
	EventProcess
	// EventSettle is a settlement (ack, nack or lost lease) of a consumed message.
	EventSettle
	// EventConsumerError is a failure a Consumer survived (or, with Terminal, stopped on).
	EventConsumerError
	// EventPublish is a batch sent by a Publisher.
	EventPublish
	// EventReceive is a poll (Receive or a Consumer's) that answered, with Messages.
	EventReceive
	// EventReplayDamaged is a damaged message a replay read past: its stored record
	// failed its checksum, so it can never be served. Topic, Partition and Offset name
	// it; the replay goes on after it.
	EventReplayDamaged
)

// String names the kind for logs and metric labels.
func (k EventKind) String() string {
	switch k {
	case EventRequest:
		return "request"
	case EventRetry:
		return "retry"
	case EventBreakerOpen:
		return "breaker_open"
	case EventBreakerClose:
		return "breaker_close"
	case EventProcess:
		return "process"
	case EventSettle:
		return "settle"
	case EventConsumerError:
		return "consumer_error"
	case EventPublish:
		return "publish"
	case EventReceive:
		return "receive"
	case EventReplayDamaged:
		return "replay_damaged"
	}
	return "unknown"
}

// Event is what the client reports to an Observer. Fields that do not apply to a kind
// are zero.
type Event struct {
	Kind EventKind
	// Context is the context of the call or handler the event belongs to, so tracing
	// adapters can parent their spans; nil for background events (breakers).
	Context context.Context
	// Op is the operation ("produce", "consume-batch", "ack", ...).
	Op string
	// Topic is the topic concerned, or "".
	Topic string
	// Partition and Offset name the message an EventReplayDamaged reports.
	Partition int32
	Offset    int64
	// Node is the endpoint concerned, or "".
	Node string
	// Status is the HTTP status of a request, or 0.
	Status int
	// Attempt counts the attempts of a call, from 1.
	Attempt int
	// Messages is how many messages the event covers (a poll, a batch).
	Messages int
	// Outcome is "ack", "nack" or "lost" for EventSettle.
	Outcome string
	// Message is the message concerned by EventProcess and EventSettle.
	Message *Message
	// Start is when the reported work began; Duration how long it took.
	Start    time.Time
	Duration time.Duration
	// Err is the failure, or nil.
	Err error
	// Terminal marks an EventConsumerError that stopped the consumer.
	Terminal bool
}

// Observer receives every Event of a Client. It must be quick and safe for concurrent use.
type Observer func(Event)

// Observers returns an Observer that calls each non-nil observer in turn, so metrics and
// tracing adapters can watch one client together.
func Observers(os ...Observer) Observer {
	var list []Observer
	for _, o := range os {
		if o != nil {
			list = append(list, o)
		}
	}
	return func(e Event) {
		for _, o := range list {
			o(e)
		}
	}
}
