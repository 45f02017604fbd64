package httpapi

import (
	"encoding/json"
	"net/http"

	"github.com/narad-mq/narad/broker/internal/broker"
)

// Starting answers a node's HTTP port while the node is not yet ready to serve: a
// cluster node waits for its control plane (its peers, or for an admin to add it), and
// any node recovers its partitions first. /healthz says the process is up; every other
// request, /readyz included, answers 503 unavailable with Retry-After, so load balancers
// and clients see "not yet" instead of a refused connection. The real API replaces it
// once the node is ready (it cannot serve before then: whether security is on is known
// only once the users have been read from the metadata).
func Starting() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]string{"status": "ok"})
			return
		}
		writeError(w, broker.ErrUnavailable)
	})
}
