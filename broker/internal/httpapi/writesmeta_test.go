package httpapi

import (
	"net/http"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
)

// TestEveryWriteIsClassified: every operation of the spec that is not a GET either
// writes the metadata (and is decided on a view caught up with the controller) or is
// a data operation (decided on the node's own view). A new write operation fails
// here until it is put on one side: the credentials route of remote children was
// added without being counted as a metadata write.
func TestEveryWriteIsClassified(t *testing.T) {
	t.Parallel()
	meta := map[string]any{
		"createTopic": apigen.CreateTopicRequestObject{}, "alterTopic": apigen.AlterTopicRequestObject{},
		"deleteTopic": apigen.DeleteTopicRequestObject{}, "forceLeader": apigen.ForceLeaderRequestObject{},
		"attachChild": apigen.AttachChildRequestObject{}, "detachChild": apigen.DetachChildRequestObject{},
		"pauseChild": apigen.PauseChildRequestObject{}, "resumeChild": apigen.ResumeChildRequestObject{},
		"setChildCredentials": apigen.SetChildCredentialsRequestObject{}, "updateRemoteChild": apigen.UpdateRemoteChildRequestObject{},
		"createUser": apigen.CreateUserRequestObject{}, "deleteUser": apigen.DeleteUserRequestObject{},
		"replaceGrants": apigen.ReplaceGrantsRequestObject{}, "changePassword": apigen.ChangePasswordRequestObject{},
		"joinMember": apigen.JoinMemberRequestObject{}, "decommissionMember": apigen.DecommissionMemberRequestObject{},
		"movePartition": apigen.MovePartitionRequestObject{}, "cancelMove": apigen.CancelMoveRequestObject{},
		"rebalance": apigen.RebalanceRequestObject{},
	}
	data := map[string]any{
		"produce": apigen.ProduceRequestObject{}, "produceBatch": apigen.ProduceBatchRequestObject{},
		"ack": apigen.AckRequestObject{}, "ackBatch": apigen.AckBatchRequestObject{},
	}
	spec, err := apigen.GetSwagger()
	if err != nil {
		t.Fatal(err)
	}
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			if method == http.MethodGet {
				continue
			}
			id := strings.ToLower(op.OperationID[:1]) + op.OperationID[1:] // the embedded spec capitalizes them
			m, isMeta := meta[id]
			d, isData := data[id]
			switch {
			case isMeta && !writesMeta(m):
				t.Errorf("%s %s (%s) writes the metadata but writesMeta says no", method, path, id)
			case isData && writesMeta(d):
				t.Errorf("%s %s (%s) is a data operation but writesMeta says it writes the metadata", method, path, id)
			case !isMeta && !isData:
				t.Errorf("%s %s (%s) is not classified: add it to writesMeta (it changes the metadata) or to this test's data operations", method, path, id)
			}
		}
	}
}
