package httpapi

import (
	"net/http"
	"testing"
)

// TestAlterWithANullSchemaKeepsIt: "schema": null in an alter is a schema left out,
// not a removal ({} removes it). Clients generated from the spec send it for every
// alter that does not change the schema (the Go SDK's AlterTopicRequest, and so the
// CLI, carries "schema": null): read as a removal, every such alter would drop the
// topic's schema. A guard, from a review of 6 December that nearly made it one.
func TestAlterWithANullSchemaKeepsIt(t *testing.T) {
	t.Parallel()
	f := &moveBroker{}
	do := moveServer(t, f, Options{})
	for _, body := range []string{`{"schema":null}`, `{"retention_ms":60000,"schema":null}`} {
		if a := do("PATCH", "/v1/topics/orders", body); a.status != http.StatusOK {
			t.Fatalf("%s: %d %s", body, a.status, a.body)
		}
		f.mu.Lock()
		s := f.alter.Schema
		f.mu.Unlock()
		if s != nil {
			t.Errorf("%s handed the broker schema %s; want none (the schema kept)", body, *s)
		}
	}
}
