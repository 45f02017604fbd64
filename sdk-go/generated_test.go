package narad_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// TestRequestsComeFromTheGeneratedClient: one spec (openapi.yaml) generates the broker's
// stubs and the Go client, so the two cannot drift, but only if the SDK builds its
// requests with the generated api.New<Op>Request builders. A request built by hand (a
// path written out, or net/http's request constructors) would keep compiling after a
// spec change that breaks it. This fails on any such request in the SDK's code outside
// sdk-go/api: a string literal that is one of the spec's paths, or a call that makes a
// request without a builder.
func TestRequestsComeFromTheGeneratedClient(t *testing.T) {
	spec, err := os.ReadFile(filepath.Join("..", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The first segment of every path the spec has: v1, readyz, healthz, metrics, ...
	roots := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  (/[^\s:]+):`).FindAllSubmatch(spec, -1) {
		first, _, _ := strings.Cut(strings.TrimPrefix(string(m[1]), "/"), "/")
		roots[first] = true
	}
	if !roots["v1"] || !roots["readyz"] {
		t.Fatalf("could not read the spec's paths (found roots %v)", roots)
	}
	handMade := map[string]bool{"NewRequest": true, "NewRequestWithContext": true, "Get": true, "Post": true, "Head": true, "PostForm": true}

	files := 0
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == "api" || d.Name() == "testdata" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		files++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		httpName := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"net/http"` {
				httpName = "http"
				if imp.Name != nil {
					httpName = imp.Name.Name
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				if n.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(n.Value)
				if err != nil || !strings.HasPrefix(s, "/") {
					return true
				}
				first, _, _ := strings.Cut(strings.TrimPrefix(s, "/"), "/")
				first, _, _ = strings.Cut(first, "?")
				if roots[first] {
					t.Errorf("%s: the literal %q is an API path written by hand; build the request with the generated api.New<Op>Request", fset.Position(n.Pos()), s)
				}
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && httpName != "" && id.Name == httpName && handMade[n.Sel.Name] {
					t.Errorf("%s: %s.%s makes a request by hand; build it with the generated api.New<Op>Request", fset.Position(n.Pos()), id.Name, n.Sel.Name)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 10 {
		t.Fatalf("looked at only %d files: is the test running in sdk-go?", files)
	}
}

// TestRetryRebuildsTheRequest: the generated builder runs once per attempt, so a retried
// produce sends its whole body again, with its content type and key, and an endpoint's
// path prefix (a broker behind a proxy at /narad) is kept, as before the SDK used the
// generated client.
func TestRetryRebuildsTheRequest(t *testing.T) {
	type seen struct {
		path, query, ctype, accept, ua, body string
		user, pass                           string
	}
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u, p, _ := r.BasicAuth()
		mu.Lock()
		got = append(got, seen{r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Content-Type"), r.Header.Get("Accept"), r.Header.Get("User-Agent"), string(b), u, p})
		first := len(got) == 1
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if first {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"code":"unavailable","message":"try again"}}`)
			return
		}
		io.WriteString(w, `{"partition":1,"offset":7}`)
	}))
	defer srv.Close()
	c, err := narad.New([]string{srv.URL + "/narad/"},
		narad.WithBasicAuth("alice", "s3cret"), narad.WithUserAgent("orders-svc"),
		narad.WithRetry(narad.RetryPolicy{Attempts: 3, Backoff: func() narad.Backoff { return narad.NewFullJitter(time.Millisecond, time.Millisecond) }}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := c.Produce(ctx, "orders", "hello, world", narad.WithKey("k 1"), narad.WithPartition(1))
	if err != nil {
		t.Fatal(err)
	}
	if p.Partition != 1 || p.Offset != 7 {
		t.Fatalf("produced %+v, want partition 1 offset 7", p)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("the broker saw %d requests, want 2 (one 503, one retry): %+v", len(got), got)
	}
	want := seen{"/narad/v1/topics/orders/produce", "key=k+1&partition=1", "text/plain; charset=utf-8", "application/json", "orders-svc", "hello, world", "alice", "s3cret"}
	for i, g := range got {
		if g != want {
			t.Errorf("attempt %d sent %+v, want %+v", i+1, g, want)
		}
	}
}
