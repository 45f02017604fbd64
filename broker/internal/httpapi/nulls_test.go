package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
)

// A null for an optional member of a batch body is refused, not taken as absent: the
// spec gives each a type that null is not (schemathesis found validate_only: null
// accepted with a 202).
func TestBatchBodyRefusesNullMembers(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"messages":[{"payload":1}],"validate_only":null}`,
		`{"messages":[{"payload":1}],"incarnation":null}`,
		`{"messages":[{"payload":1,"timestamp":null}]}`,
		`{"messages":[{"payload":1,"origin":null}]}`,
		`{"messages":[{"payload":1,"key":null}]}`,
		`{"messages":[{"payload":1,"partition":null}]}`,
	} {
		var req apigen.ProduceBatchRequest
		err := strictDecode([]byte(body), &req)
		if err == nil || !strings.Contains(err.Error(), "is null") {
			t.Errorf("%s: decoded (%v), want a refusal naming the null member", body, err)
		}
	}
	var req apigen.ProduceBatchRequest
	if err := strictDecode([]byte(`{"messages":[{"payload":null}],"validate_only":true}`), &req); err != nil {
		t.Errorf("a null payload (a JSON value) was refused: %v", err)
	}
}

// A validate_only batch still has to match the spec: a message without a payload is
// refused before anything is asked of the broker (schemathesis found it answered 202).
func TestValidateOnlyBatchNeedsPayloads(t *testing.T) {
	t.Parallel()
	yes := true
	h := &handlers{} // no broker: the refusal comes first
	_, err := h.ProduceBatch(context.Background(), apigen.ProduceBatchRequestObject{Topic: "t",
		Body: &apigen.ProduceBatchRequest{ValidateOnly: &yes, Messages: []apigen.OutgoingMessage{{}}}})
	var ae *apiError
	if !errors.As(err, &ae) || ae.status != http.StatusBadRequest {
		t.Fatalf("a validate_only batch with a message without payload: %v, want 400", err)
	}
}

// A validate_only batch is refused for what a batch that stores would be refused for
// in its messages' form: an incomplete origin, a bad timestamp, key or partition
// (schemathesis found an origin without cluster_id answered 202).
func TestValidateOnlyBatchChecksTheMessagesForm(t *testing.T) {
	t.Parallel()
	yes := true
	h := &handlers{} // no broker: the refusal comes first
	bad := int32(-5)
	ts := int64(0)
	for name, m := range map[string]apigen.OutgoingMessage{
		"origin without cluster_id": {Payload: []byte(`1`), Origin: &apigen.MessageOrigin{Topic: "G", Partition: 7, Offset: 5}},
		"timestamp 0":               {Payload: []byte(`1`), Timestamp: &ts},
		"partition -5":              {Payload: []byte(`1`), Partition: &bad},
	} {
		_, err := h.ProduceBatch(context.Background(), apigen.ProduceBatchRequestObject{Topic: "t",
			Body: &apigen.ProduceBatchRequest{ValidateOnly: &yes, Messages: []apigen.OutgoingMessage{m}}})
		var ae *apiError
		if !errors.As(err, &ae) || ae.status != http.StatusBadRequest {
			t.Errorf("a validate_only batch with a message with %s: %v, want 400", name, err)
		}
	}
}
