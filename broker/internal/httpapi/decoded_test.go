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

var updateStrictGolden = flag.Bool("update-strict-golden", false, "rewrite the generated functions' copies in testdata/*.golden from apigen.gen.go (after checking decoded.go and direct.go against it)")

// TestCopiesFollowTheGeneratedCode pins the two places that repeat generated steps
// to the generated functions they repeat: decodedOnce (decoded.go) the strict handlers
// of the two batch routes, whose code offers no hook to hand it a body decoded
// already; serveDirect (direct.go) the router functions and strict handlers of
// produce, consume and ack. Each copies their steps: parameters bound in order, the
// middlewares in order, the handler, Visit…Response, the error handler. When
// oapi-codegen changes those functions, this test fails: bring the copy in line with
// the new steps, then run
//
//	go test ./internal/httpapi -run TestCopiesFollowTheGeneratedCode -update-strict-golden
func TestCopiesFollowTheGeneratedCode(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, filepath.Join("..", "apigen", "apigen.gen.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The batch routes' strict handlers (decodedOnce), and the direct routes' router
	// functions and strict handlers (serveDirect in direct.go).
	type pinned struct{ recv, op, golden, copier string }
	pins := []pinned{
		{"strictHandler", "ProduceBatch", "strict-producebatch", "decodedOnce.ProduceBatch (decoded.go)"},
		{"strictHandler", "AckBatch", "strict-ackbatch", "decodedOnce.AckBatch (decoded.go)"},
	}
	for _, op := range []string{"Produce", "Consume", "Ack"} {
		pins = append(pins,
			pinned{"ServerInterfaceWrapper", op, "wrapper-" + strings.ToLower(op), "serveDirect (direct.go)"},
			pinned{"strictHandler", op, "strict-" + strings.ToLower(op), "serveDirect (direct.go)"})
	}
	for _, pin := range pins {
		op := pin.op
		var fn *ast.FuncDecl
		for _, d := range file.Decls {
			f, ok := d.(*ast.FuncDecl)
			if !ok || f.Name.Name != op || f.Recv == nil || len(f.Recv.List) != 1 {
				continue
			}
			if star, ok := f.Recv.List[0].Type.(*ast.StarExpr); ok {
				if id, ok := star.X.(*ast.Ident); ok && id.Name == pin.recv {
					fn = f
				}
			}
		}
		if fn == nil {
			t.Fatalf("apigen.gen.go has no (*%s).%s: %s repeats it and must be redone for the new generated code", pin.recv, op, pin.copier)
		}
		var b strings.Builder
		if err := printer.Fprint(&b, fset, fn); err != nil {
			t.Fatal(err)
		}
		got := b.String() + "\n"
		golden := filepath.Join("testdata", pin.golden+".golden")
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
			t.Errorf("the generated (*%s).%s changed shape; %s repeats its steps and may now differ from it.\n"+
				"Check it against the new code, then rerun with -update-strict-golden.\n--- %s\n%s\n--- apigen.gen.go\n%s",
				pin.recv, op, pin.copier, golden, want, got)
		}
	}
}
