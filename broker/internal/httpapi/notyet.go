package httpapi

import (
	"github.com/narad-mq/narad/broker/internal/broker"
)

// An operation this broker cannot offer (a Broker without the cluster methods, see
// cluster.go) answers 501 not_implemented, so clients can tell "not here" from "wrong
// request".

func notYet(what string) error {
	return &notYetError{what: what}
}

type notYetError struct{ what string }

func (e *notYetError) Error() string {
	return e.what + " is not available in this version of the broker"
}
func (e *notYetError) Unwrap() error { return broker.ErrNotImplemented }
