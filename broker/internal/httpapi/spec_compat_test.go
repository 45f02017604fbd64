package httpapi

import (
	"context"
	"path/filepath"
	"sort"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestSpecKeepsV1 holds openapi.yaml to the v1 promise: nothing of the baseline (taken
// when v1 was fixed) is removed or renamed — no path, operation, parameter, response
// status, schema, property or error code. Additions are free. Refresh the baseline only
// for a new major version.
func TestSpecKeepsV1(t *testing.T) {
	t.Parallel()
	load := func(p string) *openapi3.T {
		t.Helper()
		doc, err := openapi3.NewLoader().LoadFromFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return doc
	}
	base := load(filepath.Join("testdata", "openapi-v1-baseline.yaml"))
	cur := load(filepath.Join("..", "..", "..", "openapi.yaml"))
	if err := cur.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	for path, bi := range base.Paths.Map() {
		ci := cur.Paths.Value(path)
		if ci == nil {
			t.Errorf("path %s was removed", path)
			continue
		}
		for method, bop := range bi.Operations() {
			cop := ci.GetOperation(method)
			if cop == nil {
				t.Errorf("%s %s was removed", method, path)
				continue
			}
			if cop.OperationID != bop.OperationID {
				t.Errorf("%s %s: operationId %s renamed to %s", method, path, bop.OperationID, cop.OperationID)
			}
			params := map[string]bool{}
			for _, p := range append(ci.Parameters, cop.Parameters...) {
				params[p.Value.In+":"+p.Value.Name] = true
			}
			for _, p := range append(bi.Parameters, bop.Parameters...) {
				if !params[p.Value.In+":"+p.Value.Name] {
					t.Errorf("%s %s: parameter %s %s was removed", method, path, p.Value.In, p.Value.Name)
				}
			}
			for status := range bop.Responses.Map() {
				if cop.Responses.Value(status) == nil {
					t.Errorf("%s %s: response %s was removed", method, path, status)
				}
			}
		}
	}
	for name, bs := range base.Components.Schemas {
		cs := cur.Components.Schemas[name]
		if cs == nil {
			t.Errorf("schema %s was removed", name)
			continue
		}
		for prop := range bs.Value.Properties {
			if cs.Value.Properties[prop] == nil {
				t.Errorf("schema %s: property %s was removed", name, prop)
			}
		}
		have := map[string]bool{}
		for _, e := range cs.Value.Enum {
			have[e.(string)] = true
		}
		var missing []string
		for _, e := range bs.Value.Enum {
			if !have[e.(string)] {
				missing = append(missing, e.(string))
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("schema %s: enum values %v were removed", name, missing)
		}
	}
}
