package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCredentialsInAURLAreRefusedUnprinted: a URL carrying user:password, given as a
// flag, a variable or to context add, is refused with the password left out of the
// message. It used to be sent, and every error named the node by that URL, password
// and all (context list showed it too).
func TestCredentialsInAURLAreRefusedUnprinted(t *testing.T) {
	vars := map[string]string{"NARAD_CLI_CONFIG": filepath.Join(t.TempDir(), "contexts.json")}
	run := func(args ...string) ran {
		var stdout, stderr bytes.Buffer
		code := Run(context.Background(), args, IO{Stdout: &stdout, Stderr: &stderr, Stdin: strings.NewReader(""), Getenv: func(k string) string { return vars[k] }})
		return ran{code, stdout.String(), stderr.String()}
	}
	check := func(what string, r ran) {
		t.Helper()
		if r.code != ExitUsage || strings.Contains(r.stdout+r.stderr, "s3cret") || !strings.Contains(r.stderr, "--password-file") {
			t.Errorf("%s: %+v", what, r)
		}
	}
	check("--url", run("topic", "list", "--url", "http://ops:s3cret@127.0.0.1:1"))
	vars["NARAD_URL"] = "http://127.0.0.1:2,http://ops:s3cret@127.0.0.1:1"
	check("NARAD_URL", run("topic", "list"))
	delete(vars, "NARAD_URL")
	check("context add", run("context", "add", "x", "--url", "http://ops:s3cret@127.0.0.1:1"))
	if r := run("context", "list"); strings.Contains(r.stdout, "s3cret") {
		t.Errorf("context list: %+v", r)
	}
}

// TestAContextKeepsItsPasswordFileWherever: a relative --password-file given to
// context add is stored as an absolute path, so the context works from any directory.
// It was stored as given, and read relative to wherever narad ran next.
func TestAContextKeepsItsPasswordFileWherever(t *testing.T) {
	dir := t.TempDir()
	vars := map[string]string{"NARAD_CLI_CONFIG": filepath.Join(dir, "contexts.json")}
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	io := IO{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Stdin: strings.NewReader(""), Getenv: func(k string) string { return vars[k] }}
	t.Chdir(dir)
	if code := Run(context.Background(), []string{"context", "add", "c", "--url", "http://127.0.0.1:1", "--user", "u", "--password-file", "pw"}, io); code != 0 {
		t.Fatalf("context add: %d %s", code, io.Stderr)
	}
	t.Chdir(t.TempDir())
	tg, err := (&env{IO: io, g: &globals{}}).target()
	if err != nil || tg.User != "u" || tg.Password != "secret" {
		t.Fatalf("the context from another directory: %+v %v", tg, err)
	}
}
