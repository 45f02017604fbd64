package httpapi

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// reservedCodes are codes of openapi.yaml's ErrorCode enum that no answer of this
// version carries, with why they are in the spec. A code leaves this list when the
// server starts to use it.
var reservedCodes = map[string]string{
	"in_flight_full": "named in v1 for a consume refused at the in-flight cap; this version answers 204 (nothing to lease) instead",
}

// TestErrorCodesMatchTheSpec holds the one list of error codes together: every code of
// openapi.yaml's ErrorCode enum is answered somewhere by httpapi or the broker (or is
// listed in reservedCodes with its reason), and every code the Go code answers with is
// in the enum. Codes are named only through the generated apigen.ErrorCode constants,
// never as string literals, so a code the spec drops fails the build and a code it adds
// fails this test until something answers with it.
func TestErrorCodesMatchTheSpec(t *testing.T) {
	t.Parallel()
	specPath, err := testutil.SpecPath()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	schema := doc.Components.Schemas["ErrorCode"]
	if schema == nil || schema.Value == nil {
		t.Fatal("openapi.yaml has no components.schemas.ErrorCode")
	}
	spec := map[string]bool{}
	for _, v := range schema.Value.Enum {
		spec[v.(string)] = true
	}

	// The generated constants, name to code, read from apigen's source.
	consts := map[string]string{}
	fset := token.NewFileSet()
	gen, err := parser.ParseFile(fset, filepath.Join("..", "apigen", "apigen.gen.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(gen, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || vs.Type == nil || len(vs.Values) != 1 {
			return true
		}
		if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "ErrorCode" {
			lit := vs.Values[0].(*ast.BasicLit)
			consts[vs.Names[0].Name], _ = strconv.Unquote(lit.Value)
		}
		return true
	})
	if len(consts) != len(spec) {
		t.Fatalf("apigen has %d ErrorCode constants, openapi.yaml %d codes: run make gen", len(consts), len(spec))
	}

	used := map[string]string{} // code → a place that answers with it
	// The functions that take a code, by package, and the index of the code argument.
	takesCode := map[string]map[string]int{
		".":                           {"newErr": 1, "jsonErrorResponse": 2},
		filepath.Join("..", "broker"): {"invalid": 0},
	}
	for dir, takes := range takesCode {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(fset, f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(file, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					if x, ok := n.X.(*ast.Ident); ok && x.Name == "apigen" {
						if code, ok := consts[n.Sel.Name]; ok {
							used[code] = fset.Position(n.Pos()).String()
						}
					}
				case *ast.CallExpr:
					// The functions that take a code take it typed; an untyped string
					// literal would still compile, so refuse it here.
					fn, ok := n.Fun.(*ast.Ident)
					if !ok {
						return true
					}
					if at, named := takes[fn.Name]; named && at < len(n.Args) {
						if _, lit := n.Args[at].(*ast.BasicLit); lit {
							t.Errorf("%s: %s takes a literal error code; use the apigen.ErrorCode constant", fset.Position(n.Pos()), fn.Name)
						}
					}
				case *ast.KeyValueExpr:
					if k, ok := n.Key.(*ast.Ident); ok && k.Name == "code" {
						if _, lit := n.Value.(*ast.BasicLit); lit {
							t.Errorf("%s: a literal error code; use the apigen.ErrorCode constant", fset.Position(n.Pos()))
						}
					}
				}
				return true
			})
		}
	}

	var codes []string
	for c := range spec {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	for _, c := range codes {
		_, reserved := reservedCodes[c]
		where, answered := used[c]
		switch {
		case answered && reserved:
			t.Errorf("code %q is answered (%s) but listed in reservedCodes: take it off the list", c, where)
		case !answered && !reserved:
			t.Errorf("code %q of openapi.yaml is answered nowhere in httpapi or the broker: map a domain error to it, or list it in reservedCodes with why", c)
		}
	}
	for c := range reservedCodes {
		if !spec[c] {
			t.Errorf("reservedCodes lists %q, which openapi.yaml does not name", c)
		}
	}
	for c, where := range used {
		if !spec[c] {
			t.Errorf("%s answers with %q, which openapi.yaml's ErrorCode enum does not name", where, c)
		}
	}
}
