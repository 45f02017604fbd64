package cli

import (
	"strings"
	"testing"
)

// TestAFailedCommandSaysNaradOnce: a command that failed printed the SDK's error after
// its own prefix, and both began with narad: "narad produce: narad: produce orders at
// …". It says it once now, and still names the operation, the node and the answer.
func TestAFailedCommandSaysNaradOnce(t *testing.T) {
	f := &fakeAPI{answers: map[string]fakeAnswer{
		"POST /v1/topics/orders/produce": {404, `{"error":{"code":"topic_not_found","message":"no such topic; create it with POST /v1/topics"}}`},
	}}
	r := runAgainst(t, f, "produce", "orders", "hello")
	if r.code != ExitNotFound || !strings.HasPrefix(r.stderr, "narad produce: produce orders at http://") ||
		!strings.Contains(r.stderr, "404 topic_not_found: no such topic") || strings.Count(r.stderr, "narad") != 1 {
		t.Fatalf("a produce to a missing topic: %+v; want exit %d and one line naming narad once", r, ExitNotFound)
	}
}
