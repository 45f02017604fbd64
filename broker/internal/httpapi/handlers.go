package httpapi

import (
	"context"
	"errors"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/meta"
)

// Limits on request bodies.
const (
	MaxPayloadBytes   = 1 << 20                // one produced message
	MaxPayloadDepth   = broker.MaxPayloadDepth // nesting of a JSON payload's arrays and objects
	MaxBatchBodyBytes = 8 << 20                // a produce-batch or ack-batch body
	MaxAdminBodyBytes = 1 << 20                // any other JSON body
	MaxHeaderBytes    = 64 << 10               // a request's headers (the server's http.Server.MaxHeaderBytes)
)

// Broker is what the HTTP API needs from the broker.
type Broker interface {
	Ready() bool
	NodeID() string
	CreateTopic(ctx context.Context, s broker.TopicSpec) (meta.Topic, error)
	Topics() ([]meta.Topic, error)
	Exists(name string) error
	Topic(name string) (meta.Topic, []broker.PartitionInfo, error)
	TopicStats(name string) (broker.TopicStats, error)
	StatsInterval() time.Duration
	NodeStats() broker.NodeStats
	TopicMeta(name string) (meta.Topic, error)
	AlterTopic(ctx context.Context, name string, a broker.TopicAlter) (meta.Topic, error)
	DeleteTopic(ctx context.Context, name string, incarnation uint64) error
	Produce(ctx context.Context, topic string, msgs []broker.Outgoing) ([]broker.Produced, error)
	Consume(ctx context.Context, topic string, max int, wait time.Duration) ([]broker.Delivered, error)
	Ack(topic string, reqs []broker.AckReq) []error
	Read(ctx context.Context, topic string, part int32, spec broker.ReadSpec) (broker.ReadResult, error)
	ReadOne(ctx context.Context, topic string, part int32, offset uint64) (*broker.Delivered, error)
	User(name string) (auth.User, bool)
	// Clustered reports whether other nodes may write metadata this node has not
	// applied yet; CatchUp waits until it has applied what the controller committed.
	Clustered() bool
	CatchUp(ctx context.Context) error
	Users() ([]auth.User, error)
	CreateUser(ctx context.Context, name, password string, grants []auth.Grant) (auth.User, error)
	DeleteUser(ctx context.Context, name string) error
	SetGrants(ctx context.Context, name string, grants []auth.Grant) (auth.User, error)
	SetPassword(ctx context.Context, name, password string) error
	AttachChild(ctx context.Context, parent, child string, delayMs int64) (broker.ChildInfo, error)
	DetachChild(ctx context.Context, parent, child string) error
	Children(parent string) ([]broker.ChildInfo, error)
	// Remote children and the produce-batch checks they use (remotechild.go).
	ProduceChecked(ctx context.Context, topic string, chk broker.ProduceCheck, msgs []broker.Outgoing) ([]broker.Produced, error)
	AttachRemoteChild(ctx context.Context, parent string, spec broker.RemoteSpec) (broker.RemoteChildInfo, error)
	DetachRemoteChild(ctx context.Context, parent, id string) error
	PauseRemoteChild(ctx context.Context, parent, id string, paused bool) error
	UpdateRemoteCredentials(ctx context.Context, parent, id, password string) error
	UpdateRemoteChild(ctx context.Context, parent, id string, u broker.RemoteUpdate) (broker.RemoteChildInfo, error)
	RemoteChildren(parent string) ([]broker.RemoteChildInfo, error)
}

// handlers implements the generated strict server interface. Handlers return domain
// errors; the strict server's error hook turns them into JSON error bodies.
type handlers struct {
	b     Broker
	authn *authenticator // checks the current password of a password change
}

var _ apigen.StrictServerInterface = (*handlers)(nil)

func (h *handlers) Healthz(ctx context.Context, _ apigen.HealthzRequestObject) (apigen.HealthzResponseObject, error) {
	return apigen.Healthz200JSONResponse{Status: "ok"}, nil
}

func (h *handlers) Readyz(ctx context.Context, _ apigen.ReadyzRequestObject) (apigen.ReadyzResponseObject, error) {
	if !h.b.Ready() {
		return nil, broker.ErrUnavailable
	}
	return apigen.Readyz200JSONResponse{Status: "ready"}, nil
}

// Metrics is served by the Prometheus handler directly (see server.go); this method only
// satisfies the interface.
func (h *handlers) Metrics(ctx context.Context, _ apigen.MetricsRequestObject) (apigen.MetricsResponseObject, error) {
	return nil, errors.New("metrics are served by the Prometheus handler")
}

func ownerID(ctx context.Context) uint64 {
	if u := principal(ctx); u != nil {
		return u.ID
	}
	return 0
}
