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

// TestAContextsCredentialsGoToItsNodesOnly: with --url or NARAD_URL naming a node that
// is not one of the context's, the context's user and password are not sent there
// (they were: a typo or a test node got the production password); nor is its password
// paired with another user given by flag.
func TestAContextsCredentialsGoToItsNodesOnly(t *testing.T) {
	vars := map[string]string{"NARAD_CLI_CONFIG": filepath.Join(t.TempDir(), "contexts.json")}
	io := IO{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Stdin: strings.NewReader(""), Getenv: func(k string) string { return vars[k] }}
	if code := Run(context.Background(), []string{"context", "add", "prod", "--url", "https://n1.example:7942,https://N2.example", "--user", "ops", "--password", "s3cret"}, io); code != 0 {
		t.Fatalf("context add: %d %s", code, io.Stderr)
	}
	for _, c := range []struct {
		what      string
		g         globals
		env       string
		user, pwd string
	}{
		{what: "the context's own nodes", user: "ops", pwd: "s3cret"},
		{what: "--url one of its nodes", g: globals{urls: stringList{"https://n1.example:7942"}}, user: "ops", pwd: "s3cret"},
		{what: "--url its other node, default port written", g: globals{urls: stringList{"https://n2.example:443/"}}, user: "ops", pwd: "s3cret"},
		{what: "--url another host", g: globals{urls: stringList{"https://evil.example:7942"}}},
		{what: "--url another port", g: globals{urls: stringList{"https://n1.example:7943"}}},
		{what: "--url plain HTTP to its node", g: globals{urls: stringList{"http://n1.example:7942"}}},
		{what: "--url one of its nodes and another", g: globals{urls: stringList{"https://n1.example:7942", "http://127.0.0.1:7942"}}},
		{what: "NARAD_URL another host", env: "http://127.0.0.1:7942"},
		{what: "--user another user", g: globals{user: "alice"}, user: "alice"},
	} {
		vars["NARAD_URL"] = c.env
		g := c.g
		tg, err := (&env{IO: io, g: &g}).target()
		if err != nil || tg.User != c.user || tg.Password != c.pwd {
			t.Errorf("%s: user %q password %q (%v); want %q %q", c.what, tg.User, tg.Password, err, c.user, c.pwd)
		}
	}
}
