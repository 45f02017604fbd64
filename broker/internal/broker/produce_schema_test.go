package broker

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestSchemaTopicTakesJSONSentAsBytes: on a topic with a schema, a payload whose bytes
// are JSON matching the schema is accepted however it was sent (older clients send JSON
// as application/octet-stream), and is stored as JSON. Bytes that are not JSON, or JSON
// that does not match, are still refused; a topic without a schema keeps the kind the
// client chose.
func TestSchemaTopicTakesJSONSentAsBytes(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	schema := []byte(`{"type":"object","required":["id"],"properties":{"id":{"type":"string"}}}`)
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "typed", Partitions: ptr[int32](1), Schema: schema}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "plain", Partitions: ptr[int32](1)}); err != nil {
		t.Fatal(err)
	}

	accepted := []Outgoing{
		{Partition: -1, Value: []byte(`{"id":"bytes"}`), Attrs: PayloadKindBinary},
		{Partition: -1, Value: []byte(" {\"id\":\"text\"}\n"), Attrs: PayloadKindText},
		{Partition: -1, Value: []byte(`{"id":"json"}`), Attrs: PayloadKindJSON},
	}
	res, err := b.Produce(ctx, "typed", accepted)
	if err != nil {
		t.Fatalf("JSON that matches the schema, sent as bytes and as text: %v", err)
	}
	got, _, err := readRange(b, ctx, "typed", 0, ptr[uint64](0), nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(accepted) {
		t.Fatalf("read %d messages, want %d (results %+v)", len(got), len(accepted), res)
	}
	for i, d := range got {
		if k := d.Attrs & PayloadKindMask; k != PayloadKindJSON {
			t.Errorf("message %d (%q) stored as kind %d, want JSON (%d)", i, d.Value, k, PayloadKindJSON)
		}
		if string(d.Value) != string(accepted[i].Value) {
			t.Errorf("message %d stored as %q, want the bytes sent, %q", i, d.Value, accepted[i].Value)
		}
	}

	refused := map[string]Outgoing{
		"JSON bytes that do not match":  {Partition: -1, Value: []byte(`{"id":5}`), Attrs: PayloadKindBinary},
		"bytes that are not JSON":       {Partition: -1, Value: []byte{0xff, 0x00, 0x7b}, Attrs: PayloadKindBinary},
		"text that is not JSON":         {Partition: -1, Value: []byte("hello"), Attrs: PayloadKindText},
		"JSON with invalid UTF-8 bytes": {Partition: -1, Value: []byte("{\"id\":\"\xff\"}"), Attrs: PayloadKindBinary},
		"empty bytes":                   {Partition: -1, Value: nil, Attrs: PayloadKindBinary},
	}
	for name, m := range refused {
		_, err := b.Produce(ctx, "typed", []Outgoing{m})
		var se *SchemaError
		if !errors.Is(err, ErrSchemaViolation) || !errors.As(err, &se) {
			t.Errorf("%s: err %v, want a schema violation", name, err)
		}
	}
	// One refused message refuses the batch, and the accepted one's kind is not changed
	// in the caller's slice either way.
	batch := []Outgoing{
		{Partition: -1, Value: []byte(`{"id":"ok"}`), Attrs: PayloadKindBinary},
		{Partition: -1, Value: []byte("nope"), Attrs: PayloadKindBinary},
	}
	if _, err := b.Produce(ctx, "typed", batch); !errors.Is(err, ErrSchemaViolation) {
		t.Errorf("batch with one non-JSON message: err %v, want a schema violation", err)
	}
	if batch[0].Attrs != PayloadKindBinary {
		t.Errorf("Produce changed the caller's message kind to %d", batch[0].Attrs)
	}
	if got, _, _ := readRange(b, ctx, "typed", 0, ptr[uint64](0), nil, 10); len(got) != len(accepted) {
		t.Errorf("refused produces wrote: %d messages, want %d", len(got), len(accepted))
	}

	// No schema: the kind stays as sent.
	if _, err := b.Produce(ctx, "plain", []Outgoing{{Partition: -1, Value: []byte(`{"id":"bytes"}`), Attrs: PayloadKindBinary}}); err != nil {
		t.Fatal(err)
	}
	got, _, err = readRange(b, ctx, "plain", 0, ptr[uint64](0), nil, 10)
	if err != nil || len(got) != 1 {
		t.Fatalf("read plain: %d messages, err %v", len(got), err)
	}
	if k := got[0].Attrs & PayloadKindMask; k != PayloadKindBinary {
		t.Errorf("a topic without a schema stored bytes as kind %d, want bytes (%d)", k, PayloadKindBinary)
	}
}

// TestSchemaTopicBytesKeepTheDepthLimit: JSON sent as bytes to a topic with a schema is
// stored and delivered as JSON, so it must keep within the nesting a consumer's JSON
// decoder takes, exactly as JSON declared as JSON must (the HTTP layer checks that).
func TestSchemaTopicBytesKeepTheDepthLimit(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "typed", Partitions: ptr[int32](1), Schema: []byte(`{"type":"array"}`)}); err != nil {
		t.Fatal(err)
	}
	deep := []byte(strings.Repeat("[", MaxPayloadDepth+1) + strings.Repeat("]", MaxPayloadDepth+1))
	_, err := b.Produce(ctx, "typed", []Outgoing{{Partition: -1, Value: deep, Attrs: PayloadKindBinary}})
	var ie *InvalidError
	if !errors.As(err, &ie) || ie.Code != "invalid_payload" {
		t.Fatalf("JSON %d deep sent as bytes to a schema topic: err %v, want invalid_payload", MaxPayloadDepth+1, err)
	}
	ok := []byte(strings.Repeat("[", MaxPayloadDepth) + strings.Repeat("]", MaxPayloadDepth))
	if _, err := b.Produce(ctx, "typed", []Outgoing{{Partition: -1, Value: ok, Attrs: PayloadKindBinary}}); err != nil {
		t.Fatalf("JSON exactly %d deep sent as bytes: %v", MaxPayloadDepth, err)
	}
	if got, _, _ := readRange(b, ctx, "typed", 0, ptr[uint64](0), nil, 10); len(got) != 1 {
		t.Fatalf("topic holds %d messages, want the 1 accepted", len(got))
	}
}
