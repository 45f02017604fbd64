package httpapi

import (
	"flag"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateStrictGolden = flag.Bool("update-strict-golden", false, "rewrite testdata/strict-*.golden from apigen.gen.go (after checking decoded.go against it)")

// TestDecodedOnceFollowsTheGeneratedHandler pins decodedOnce (decoded.go) to the
// generated strict handler whose steps it repeats for the two batch routes. The
// generated code offers no hook to hand it a body decoded already, so decodedOnce
// copies its steps: the middlewares in order, the handler, Visit…Response, the error
// handler. When oapi-codegen changes those functions, this test fails: bring decoded.go
// in line with the new steps, then run
//
//	go test ./internal/httpapi -run TestDecodedOnceFollowsTheGeneratedHandler -update-strict-golden
func TestDecodedOnceFollowsTheGeneratedHandler(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, filepath.Join("..", "apigen", "apigen.gen.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"ProduceBatch", "AckBatch"} {
		var fn *ast.FuncDecl
		for _, d := range file.Decls {
			f, ok := d.(*ast.FuncDecl)
			if !ok || f.Name.Name != op || f.Recv == nil || len(f.Recv.List) != 1 {
				continue
			}
			if star, ok := f.Recv.List[0].Type.(*ast.StarExpr); ok {
				if id, ok := star.X.(*ast.Ident); ok && id.Name == "strictHandler" {
					fn = f
				}
			}
		}
		if fn == nil {
			t.Fatalf("apigen.gen.go has no (*strictHandler).%s: decodedOnce in decoded.go serves it and must be redone for the new generated code", op)
		}
		var b strings.Builder
		if err := printer.Fprint(&b, fset, fn); err != nil {
			t.Fatal(err)
		}
		got := b.String() + "\n"
		golden := filepath.Join("testdata", "strict-"+strings.ToLower(op)+".golden")
		if *updateStrictGolden {
			if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatal(err)
		}
		if got != string(want) {
			t.Errorf("the generated (*strictHandler).%s changed shape; decodedOnce.%s (decoded.go) repeats its steps and may now differ from it.\n"+
				"Check decoded.go against the new code, then rerun with -update-strict-golden.\n--- %s\n%s\n--- apigen.gen.go\n%s",
				op, op, golden, want, got)
		}
	}
}
