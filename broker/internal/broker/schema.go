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
// empty or {} schema means no schema. References resolve only inside the schema
// document: no URL of any scheme is fetched or opened (see insideOnly).
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
	loader := &insideOnly{}
	c.UseLoader(loader)
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, invalid("bad_request", "schema is not a valid JSON Schema: %v", err)
	}
	s, err := c.Compile(schemaURL)
	if loader.refused != "" {
		// The library's error would say how opening the URL failed; that is nothing a
		// caller may learn, and nothing was opened.
		return nil, invalid("bad_request", "the schema refers to %q, outside itself; only references inside the schema resolve (like \"#/$defs/name\"), nothing is fetched or read", loader.refused)
	}
	if err != nil {
		return nil, invalid("bad_request", "schema is not a valid JSON Schema: %v", err)
	}
	return s, nil
}

// schemaURL names a topic's schema document while it compiles; a reference that
// resolves to any other document is refused.
const schemaURL = "narad:///schema.json"

// errOutside is what insideOnly answers for every URL.
var errOutside = errors.New("references outside the schema are not resolved")

// insideOnly is the compiler's loader: it refuses every URL. The library's default
// loader opens file:// URLs on the broker's host, so a schema could read the host's
// files (and block on a device) for anyone allowed to create a topic. The JSON Schema
// meta-schemas are built into the library and never reach a loader.
type insideOnly struct{ refused string }

func (l *insideOnly) Load(url string) (any, error) {
	if l.refused == "" {
		l.refused = url
	}
	return nil, errOutside
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
