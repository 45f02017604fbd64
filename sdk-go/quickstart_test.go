package narad_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// firstGoBlock returns the first ```go block of a Markdown file.
func firstGoBlock(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	i := strings.Index(s, "```go\n")
	if i < 0 {
		t.Fatalf("%s has no ```go block", path)
	}
	s = s[i+len("```go\n"):]
	j := strings.Index(s, "```")
	if j < 0 {
		t.Fatalf("%s: the ```go block never ends", path)
	}
	return s[:j]
}

// TestReadmeQuickStart builds the README's quick start exactly as written and runs it
// twice in a row against a fresh broker: both runs must succeed.
func TestReadmeQuickStart(t *testing.T) {
	code := firstGoBlock(t, "README.md")
	sdk, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module quickstart\n\ngo 1.24\n\nrequire github.com/narad-mq/narad/sdk-go v0.0.0\n\nreplace github.com/narad-mq/narad/sdk-go => " + sdk + "\n"
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"main.go": code, "go.mod": gomod, "go.sum": string(sum)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(dir, "quickstart")
	build := exec.CommandContext(ctx, "go", "build", "-mod=mod", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the quick start does not build as written: %v\n%s", err, out)
	}
	b, err := startBroker(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.stop)
	for run := 1; run <= 2; run++ {
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = append(os.Environ(), "NARAD_URL="+b.url)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "shipping order 1") {
			t.Fatalf("run %d of the quick start: %v\n%s", run, err, out)
		}
	}
}
