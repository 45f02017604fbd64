package httpapi

import (
	"context"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// Operations this version describes in openapi.yaml but does not offer yet answer 501
// not_implemented, so clients can tell "not here yet" from "wrong request".

func notYet(what string) error {
	return &notYetError{what: what}
}

type notYetError struct{ what string }

func (e *notYetError) Error() string {
	return e.what + " is not available in this version of the broker"
}
func (e *notYetError) Unwrap() error { return broker.ErrNotImplemented }

func (h *handlers) DecommissionMember(ctx context.Context, _ apigen.DecommissionMemberRequestObject) (apigen.DecommissionMemberResponseObject, error) {
	return nil, notYet("clustering (decommission)")
}

func (h *handlers) MovePartition(ctx context.Context, _ apigen.MovePartitionRequestObject) (apigen.MovePartitionResponseObject, error) {
	return nil, notYet("clustering (partition moves)")
}
