package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/santhosh-tekuri/jsonschema/v6"
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
	t.Parallel()
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
	if err := s.checkAll(context.Background(), []Outgoing{{Value: []byte(`{"a":1,"b":2}`), Attrs: PayloadKindJSON}}); err != nil {
		t.Fatalf("valid payload refused: %v", err)
	}
	if err := s.checkAll(context.Background(), []Outgoing{{Value: []byte(`{"a":"x"}`), Attrs: PayloadKindJSON}}); !errors.Is(err, ErrSchemaViolation) {
		t.Fatalf("invalid payload: %v, want a schema violation", err)
	}
}

// TestStoredSchemaThatReachesOutside: a schema stored by an older version that refers to
// a device file neither stalls start-up nor is checked against: the broker starts, the
// topic serves consumers, and produce to it is refused with a message that says how to
// repair the topic.
func TestStoredSchemaThatReachesOutside(t *testing.T) {
	t.Parallel()
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

// wantTooComplex fails unless err is a 400 schema_too_complex.
func wantTooComplex(t *testing.T, what string, err error) {
	t.Helper()
	var inv *InvalidError
	if !errors.As(err, &inv) || inv.Code != "schema_too_complex" {
		t.Fatalf("%s: %v, want schema_too_complex", what, err)
	}
}

// anyOfChain is the audit's schema bomb: each level refers to the next twice, so
// checking a payload costs 2^levels, in about 70 bytes a level.
func anyOfChain(levels int) string {
	var defs []string
	for i := 0; i < levels; i++ {
		next := fmt.Sprintf(`{"$ref":"#/$defs/a%d"}`, i+1)
		defs = append(defs, fmt.Sprintf(`"a%d":{"anyOf":[%s,{"allOf":[%s],"type":"object"}]}`, i, next, next))
	}
	defs = append(defs, fmt.Sprintf(`"a%d":{"type":"string"}`, levels))
	return `{"$defs":{` + strings.Join(defs, ",") + `},"$ref":"#/$defs/a0"}`
}

// TestSchemaBudgetAtCreate: a schema over one of the documented budgets is refused
// with 400 schema_too_complex when it is set, by create and by alter; schemas within
// them, recursive ones included, are accepted (audit issue 16, finding 2).
func TestSchemaBudgetAtCreate(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "plain"}); err != nil {
		t.Fatal(err)
	}
	props := make([]string, MaxSchemaNodes+1)
	for i := range props {
		props[i] = fmt.Sprintf(`"p%d":{}`, i)
	}
	patterns := make([]string, MaxSchemaPatterns+1)
	for i := range patterns {
		patterns[i] = fmt.Sprintf(`{"pattern":"^a%d"}`, i)
	}
	tooComplex := []struct{ name, schema string }{
		{"over the size limit", `{"description":"` + strings.Repeat("x", MaxSchemaBytes) + `"}`},
		{"too many subschemas", `{"properties":{` + strings.Join(props, ",") + `}}`},
		{"nested too deep", strings.Repeat(`{"not":`, MaxSchemaDepth) + `{}` + strings.Repeat(`}`, MaxSchemaDepth)},
		{"an anyOf chain of 18 levels", anyOfChain(18)},
		{"an anyOf chain of 40 levels", anyOfChain(40)},
		{"a reference to itself", `{"$ref":"#"}`},
		{"a cycle of references", `{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"anyOf":[{"type":"string"},{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"}`},
		{"a cycle through not", `{"$defs":{"a":{"not":{"$ref":"#/$defs/a"}}},"properties":{"x":{"$ref":"#/$defs/a"}}}`},
		{"too many patterns", `{"anyOf":[` + strings.Join(patterns, ",") + `]}`},
		{"a pattern too long", `{"pattern":"` + strings.Repeat("a", MaxPatternBytes+1) + `"}`},
		{"a patternProperties key too long", `{"patternProperties":{"` + strings.Repeat("a", MaxPatternBytes+1) + `":{}}}`},
	}
	for _, c := range tooComplex {
		raw := json.RawMessage(c.schema)
		_, err := b.CreateTopic(ctx, TopicSpec{Name: "s", Schema: raw})
		wantTooComplex(t, "create with "+c.name, err)
		_, err = b.AlterTopic(ctx, "plain", TopicAlter{Schema: &raw})
		wantTooComplex(t, "alter to "+c.name, err)
	}
	ok := []struct{ name, schema string }{
		{"a tree that recurses through properties", `{"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}}}},"$ref":"#/$defs/node"}`},
		{"an anyOf chain of 8 levels", anyOfChain(8)},
		{"a few patterns", `{"properties":{"id":{"type":"string","pattern":"^[a-z0-9-]{1,64}$"}},"patternProperties":{"^x-":{"type":"string"}}}`},
	}
	for i, c := range ok {
		if _, err := b.CreateTopic(ctx, TopicSpec{Name: fmt.Sprintf("ok%d", i), Schema: json.RawMessage(c.schema)}); err != nil {
			t.Fatalf("create with %s: %v", c.name, err)
		}
	}
	if names := len(b.meta.Topics()); names != 1+len(ok) {
		t.Fatalf("%d topics, want %d: a refused create left one behind", names, 1+len(ok))
	}
	if m, _, _ := b.Topic("plain"); len(m.Schema) != 0 {
		t.Fatalf("a refused alter set the schema %s", m.Schema)
	}
}

// produceWithin produces msgs in a goroutine and fails the test when Produce has not
// returned within d: the old code validated a bomb for ever.
func produceWithin(t *testing.T, ctx context.Context, b *Broker, topic string, msgs []Outgoing, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := b.Produce(ctx, topic, msgs)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("produce to %s did not return within %v", topic, d)
		return nil
	}
}

// TestSchemaValidationBudget: a schema within the create-time budgets can still cost
// exponential work for some payloads (two alternatives a level, recursing with the
// payload's nesting); validating one produce request is bounded, answers 400
// schema_too_complex, and stores nothing (audit issue 16, finding 2).
func TestSchemaValidationBudget(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	// Each level tries the first alternative to the end (contains:false fails only after
	// items checked every element), then the second: 2^depth.
	bomb := `{"$defs":{"n":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/n"},"contains":false},{"type":"array","items":{"$ref":"#/$defs/n"}}]}},"$ref":"#/$defs/n"}`
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "bomb", Partitions: ptr[int32](1), Schema: json.RawMessage(bomb)}); err != nil {
		t.Fatal(err)
	}
	small := []byte(strings.Repeat("[", 6) + strings.Repeat("]", 6))
	if err := produceWithin(t, ctx, b, "bomb", []Outgoing{{Partition: -1, Value: small, Attrs: PayloadKindJSON}}, 60*time.Second); err != nil {
		t.Fatalf("a payload the schema checks cheaply: %v", err)
	}
	deep := []byte(strings.Repeat("[", 40) + strings.Repeat("]", 40))
	start := time.Now()
	err := produceWithin(t, ctx, b, "bomb", []Outgoing{{Partition: -1, Value: deep, Attrs: PayloadKindJSON}}, 60*time.Second)
	wantTooComplex(t, "a payload that costs 2^40", err)
	t.Logf("refused after %v", time.Since(start))

	// Patterns: each costs a pass over the string; a request is charged by the bytes
	// matched.
	patterns := make([]string, 200)
	for i := range patterns {
		patterns[i] = fmt.Sprintf(`{"pattern":"x%dy"}`, i)
	}
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "regex", Partitions: ptr[int32](1), Schema: json.RawMessage(`{"anyOf":[` + strings.Join(patterns, ",") + `]}`)}); err != nil {
		t.Fatal(err)
	}
	big := []byte(`"` + strings.Repeat("a", 1<<20-2) + `"`)
	err = produceWithin(t, ctx, b, "regex", []Outgoing{{Partition: -1, Value: big, Attrs: PayloadKindJSON}}, 60*time.Second)
	wantTooComplex(t, "200 patterns against 1 MiB", err)

	for _, name := range []string{"bomb", "regex"} {
		_, parts, _ := b.Topic(name)
		want := uint64(0)
		if name == "bomb" {
			want = 1
		}
		if got := parts[0].Stats.End; got != want {
			t.Fatalf("%s holds %d messages, want %d: a refused produce wrote", name, got, want)
		}
	}

	// A client that hangs up stops the work: the request's context is checked.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(20*time.Millisecond, cancel)
	err = produceWithin(t, cctx, b, "bomb", []Outgoing{{Partition: -1, Value: deep, Attrs: PayloadKindJSON}}, 60*time.Second)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("produce whose client hung up: %v, want context.Canceled", err)
	}
}

// plainValid validates with the library as it comes, without metering.
func plainValid(t testing.TB, schema, payload string) bool {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource(schemaURL, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(schemaURL)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	return s.Validate(v) == nil
}

// TestMeteringKeepsMeaning: metering rewrites every subschema's $ref into its allOf;
// the verdicts must be the library's own.
func TestMeteringKeepsMeaning(t *testing.T) {
	t.Parallel()
	schemas := []string{
		`{"type":"object","required":["id"],"properties":{"id":{"type":"string","pattern":"^[a-z]+$"},"n":{"type":"integer","minimum":0}},"additionalProperties":false}`,
		`{"$defs":{"pos":{"type":"integer","exclusiveMinimum":0}},"type":"array","items":{"$ref":"#/$defs/pos"},"minItems":1}`,
		`{"$defs":{"a":{"properties":{"a":{"type":"string"}}}},"$ref":"#/$defs/a","properties":{"b":{"type":"integer"}},"unevaluatedProperties":false}`,
		`{"$defs":{"a":{"properties":{"a":{"type":"string"}}}},"allOf":[{"properties":{"c":true}}],"$ref":"#/$defs/a","unevaluatedProperties":false}`,
		`{"oneOf":[{"type":"string"},{"type":"integer"},{"type":"number","multipleOf":0.5}]}`,
		`{"if":{"properties":{"kind":{"const":"a"}}},"then":{"required":["a"]},"else":{"required":["b"]}}`,
		`{"not":{"$ref":"#/$defs/s"},"$defs":{"s":{"type":"string"}}}`,
		`{"type":"array","prefixItems":[{"type":"string"}],"items":false,"contains":{"const":"x"},"uniqueItems":true}`,
		`{"$defs":{"node":{"type":"object","properties":{"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"unevaluatedProperties":false}},"$ref":"#/$defs/node"}`,
		`{"patternProperties":{"^x-":{"type":"string"}},"propertyNames":{"maxLength":5},"dependentSchemas":{"a":{"required":["b"]}}}`,
		`{"$id":"https://example.com/root","$defs":{"x":{"$anchor":"ex","type":"boolean"}},"items":{"$ref":"#ex"}}`,
	}
	payloads := []string{`{}`, `{"id":"abc"}`, `{"id":"ABC"}`, `{"id":"a","n":-1}`, `{"id":"a","z":1}`, `[1,2]`, `[0]`, `[]`,
		`{"a":"s","b":1}`, `{"a":"s","c":1}`, `{"a":"s","d":1}`, `"s"`, `3`, `2.5`, `2.25`, `{"kind":"a","a":1}`, `{"kind":"a","b":1}`, `{"kind":"b","b":1}`,
		`["s","x"]`, `["s"]`, `["x","x"]`, `{"children":[{"children":[]}]}`, `{"children":[{"other":1}]}`, `{"x-a":"s","a":1}`, `{"x-a":1}`, `{"toolong":1}`,
		`[true,false]`, `[true,1]`, `null`}
	for _, schema := range schemas {
		ts, err := compileSchema(json.RawMessage(schema))
		if err != nil {
			t.Fatalf("%s: %v", schema, err)
		}
		for _, p := range payloads {
			want := plainValid(t, schema, p)
			err := ts.checkAll(context.Background(), []Outgoing{{Value: []byte(p), Attrs: PayloadKindJSON}})
			if got := err == nil; got != want || (err != nil && !errors.Is(err, ErrSchemaViolation)) {
				t.Errorf("schema %s, payload %s: metered %v, library %v", schema, p, err, want)
			}
		}
	}
}

// BenchmarkSchemaCheck is the cost of checking a typical event, metered.
func BenchmarkSchemaCheck(b *testing.B) {
	ts, err := compileSchema(json.RawMessage(`{"type":"object","required":["id","type"],"properties":{"id":{"type":"string","pattern":"^[0-9a-f-]{36}$"},"type":{"enum":["order.created","order.paid"]},"customer":{"type":"object","properties":{"id":{"type":"integer"},"tier":{"type":"string"}}},"items":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"},"qty":{"type":"integer","minimum":1}}}}}}`))
	if err != nil {
		b.Fatal(err)
	}
	msgs := []Outgoing{{Value: []byte(`{"id":"7c0b9c3e-8f1a-4a52-9a57-0d2f3b1d9e41","type":"order.created","customer":{"id":42,"tier":"gold"},"items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}]}`), Attrs: PayloadKindJSON}}
	b.ReportAllocs()
	for b.Loop() {
		if err := ts.checkAll(context.Background(), msgs); err != nil {
			b.Fatal(err)
		}
	}
}
