package narad

import (
	"testing"

	"github.com/narad-mq/narad/sdk-go/api"
)

// TestCodesAreTheSpecs holds the SDK's Code constants to the ErrorCode constants
// generated from openapi.yaml: the SDK names the codes it branches on, and each must be
// one the broker can send, spelled the same.
func TestCodesAreTheSpecs(t *testing.T) {
	for sdk, spec := range map[string]api.ErrorCode{
		CodeLeaseLost:      api.ErrorCodeLeaseLost,
		CodeAckedAheadFull: api.ErrorCodeAckedAheadFull,
		CodeInFlightFull:   api.ErrorCodeInFlightFull,
		CodeUnavailable:    api.ErrorCodeUnavailable,
		CodeStorageFailed:  api.ErrorCodeStorageFailed,
		CodeMaybeStored:    api.ErrorCodeMaybeStored,
		CodeTimeout:        api.ErrorCodeTimeout,
		CodeTopicNotFound:  api.ErrorCodeTopicNotFound,
		CodeTopicExists:    api.ErrorCodeTopicExists,
		CodeNotImplemented: api.ErrorCodeNotImplemented,

		CodeIncarnationMismatch: api.ErrorCodeIncarnationMismatch,
	} {
		if sdk != string(spec) {
			t.Errorf("the SDK spells %q, openapi.yaml %q", sdk, spec)
		}
	}
}
