package broker

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/meta"
)

// compileWithin compiles raw in a goroutine and fails the test when it has not returned
// within d: a compile that opens a device file blocks forever, and the test must fail
// rather than hang.
func compileWithin(t *testing.T, raw string, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := compileSchema(json.RawMessage(raw))
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("compiling %s did not return within %v", raw, d)
		return nil
	}
}

// TestSchemaRefsStayInside: a schema's references resolve only inside the schema; no
// URL is opened, whatever its scheme, and the answer is the same whether the target
// exists or not (audit issue 16, finding 1).
func TestSchemaRefsStayInside(t *testing.T) {
	dir := t.TempDir()
	local := filepath.Join(dir, "int.json")
	if err := os.WriteFile(local, []byte(`{"type":"integer","const":4242}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"type":"integer"}`))
	}))
	defer srv.Close()

	cases := []struct{ name, schema string }{
		{"a local JSON file", `{"$ref":"file://` + local + `"}`},
		{"a local file under properties", `{"properties":{"a":{"$ref":"file://` + local + `"}}}`},
		{"a missing file", `{"$ref":"file://` + filepath.Join(dir, "missing.json") + `"}`},
		{"/etc/passwd", `{"$ref":"file:///etc/passwd"}`},
		{"/etc/passwd through $id", `{"$id":"file:///etc/","$ref":"passwd"}`},
		{"/dev/ptmx", `{"$ref":"file:///dev/ptmx"}`},
		{"/dev/ptmx as $schema", `{"$schema":"file:///dev/ptmx"}`},
		{"a file as $schema", `{"$schema":"file://` + local + `"}`},
		{"http", `{"$ref":"` + srv.URL + `/int.json"}`},
		{"https", `{"$ref":"https://example.invalid/x.json"}`},
		{"a relative ref", `{"$ref":"other.json"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := compileWithin(t, c.schema, 20*time.Second)
			var inv *InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("compiled %s: err %v, want an InvalidError", c.schema, err)
			}
			if inv.Code != "bad_request" || !strings.Contains(inv.Msg, "only references inside the schema") {
				t.Fatalf("compiled %s: %s %q, want bad_request saying only references inside the schema resolve", c.schema, inv.Code, inv.Msg)
			}
			// Nothing of the target leaks: no parse error of its content, no "no such
			// file", no first byte.
			for _, leak := range []string{"invalid character", "no such file", "4242", "root:", "permission denied"} {
				if strings.Contains(inv.Msg, leak) {
					t.Fatalf("compiled %s: message %q tells about the target (%q)", c.schema, inv.Msg, leak)
				}
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the HTTP server was asked %d times", n)
	}
	// References inside the schema still work.
	s, err := compileSchema(json.RawMessage(`{"$defs":{"n":{"type":"integer"}},"properties":{"a":{"$ref":"#/$defs/n"}},"$ref":"#/$defs/o","$comment":"x"}`))
	if err == nil || s != nil {
		// #/$defs/o does not exist: a clear refusal, not a load attempt.
		var inv *InvalidError
		if !errors.As(err, &inv) {
			t.Fatalf("a dangling inside reference: err %v, want an InvalidError", err)
		}
	}
	s, err = compileSchema(json.RawMessage(`{"$id":"https://example.com/order","$defs":{"n":{"type":"integer"}},"properties":{"a":{"$ref":"#/$defs/n"},"b":{"$ref":"order#/$defs/n"}}}`))
	if err != nil || s == nil {
		t.Fatalf("inside references: %v", err)
	}
	if err := checkSchema(s, 0, []byte(`{"a":1,"b":2}`), true); err != nil {
		t.Fatalf("valid payload refused: %v", err)
	}
	if err := checkSchema(s, 0, []byte(`{"a":"x"}`), true); !errors.Is(err, ErrSchemaViolation) {
		t.Fatalf("invalid payload: %v, want a schema violation", err)
	}
}

// TestStoredSchemaThatReachesOutside: a schema stored by an older version that refers to
// a device file neither stalls start-up nor is checked against: the broker starts, the
// topic serves consumers, and produce to it is refused with a message that says how to
// repair the topic.
func TestStoredSchemaThatReachesOutside(t *testing.T) {
	dir := t.TempDir()
	b := mustStartBroker(t, dir)
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "s", Partitions: ptr[int32](1)}); err != nil {
		t.Fatal(err)
	}
	produceN(t, b, "s", 1)
	// Store the schema behind the broker's checks, as an older version could have, and
	// restart. The old code blocked reading the device from here on.
	raw := json.RawMessage(`{"$ref":"file:///dev/ptmx"}`)
	if _, err := b.meta.AlterTopic("s", meta.Alter{Schema: &raw}); err != nil {
		t.Fatal(err)
	}
	restarted := make(chan *Broker, 1)
	go func() {
		b.Close()
		restarted <- mustStartBroker(t, dir)
	}()
	select {
	case b = <-restarted:
	case <-time.After(60 * time.Second):
		t.Fatal("closing and starting with a stored schema that refers to /dev/ptmx did not finish within 60s")
	}
	defer b.Close()
	got, err := b.Consume(ctx, "s", 1, 0)
	if err != nil || len(got) != 1 {
		t.Fatalf("consume from the topic: %d messages, %v", len(got), err)
	}
	_, err = b.Produce(ctx, "s", []Outgoing{{Partition: -1, Value: []byte(`1`), Attrs: PayloadKindJSON}})
	var ce *ConflictError
	if !errors.As(err, &ce) || !strings.Contains(ce.Msg, "stored schema") || !strings.Contains(ce.Msg, "PATCH") {
		t.Fatalf("produce to a topic whose stored schema is refused: %v, want a conflict that says to set a new schema", err)
	}
	// Setting a new schema repairs the topic.
	fixed := json.RawMessage(`{"type":"integer"}`)
	if _, err := b.AlterTopic(ctx, "s", TopicAlter{Schema: &fixed}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Produce(ctx, "s", []Outgoing{{Partition: -1, Value: []byte(`1`), Attrs: PayloadKindJSON}}); err != nil {
		t.Fatalf("produce after the repair: %v", err)
	}
}
