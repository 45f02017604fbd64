package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

var english = message.NewPrinter(language.English)

// ErrSchemaViolation means a produced payload does not match the topic's schema; the
// SchemaError says where.
var ErrSchemaViolation = errors.New("schema violation")

// SchemaError is a payload that fails its topic's JSON Schema.
type SchemaError struct {
	Index    int    // message index within the request
	Location string // JSON pointer into the payload
	Reason   string
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("message %d does not match the topic's schema at %s: %s", e.Index, e.Location, e.Reason)
}

func (e *SchemaError) Unwrap() error { return ErrSchemaViolation }

// compileSchema compiles a JSON Schema (draft 2020-12 unless it says otherwise). An
// empty or {} schema means no schema. Remote references are not fetched.
func compileSchema(raw json.RawMessage) (*jsonschema.Schema, error) {
	if len(raw) == 0 || isEmptySchema(raw) {
		return nil, nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, invalid("invalid_json", "schema is not valid JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("narad:///schema.json", doc); err != nil {
		return nil, invalid("bad_request", "schema is not a valid JSON Schema: %v", err)
	}
	s, err := c.Compile("narad:///schema.json")
	if err != nil {
		return nil, invalid("bad_request", "schema is not a valid JSON Schema: %v", err)
	}
	return s, nil
}

func isEmptySchema(raw json.RawMessage) bool {
	var m map[string]any
	return json.Unmarshal(raw, &m) == nil && len(m) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// checkSchema validates one payload (JSON bytes) against s.
func checkSchema(s *jsonschema.Schema, index int, payload []byte, isJSON bool) error {
	if !isJSON {
		return &SchemaError{Index: index, Location: "/", Reason: "the payload is not JSON, and this topic has a JSON Schema"}
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return &SchemaError{Index: index, Location: "/", Reason: "the payload is not valid JSON"}
	}
	if err := s.Validate(v); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			leaf := ve
			for len(leaf.Causes) > 0 {
				leaf = leaf.Causes[0]
			}
			return &SchemaError{Index: index, Location: "/" + strings.Join(leaf.InstanceLocation, "/"), Reason: leaf.ErrorKind.LocalizedString(english)}
		}
		return &SchemaError{Index: index, Location: "/", Reason: err.Error()}
	}
	return nil
}

// brokenSchema rejects every instance: it stands in for a stored schema that no longer
// compiles, so nothing unchecked is written.
func brokenSchema() *jsonschema.Schema {
	s, _ := compileSchema([]byte(`{"not":{}}`))
	return s
}
