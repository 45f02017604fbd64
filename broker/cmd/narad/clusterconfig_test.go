package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func envOf(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

// TestClusterFlagsAreValidated: every way to misconfigure a cluster node is refused at
// start with a message that names the setting to fix.
func TestClusterFlagsAreValidated(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte("0123456789abcdef-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := map[string]string{"NARAD_CLUSTER_SECRET": "0123456789abcdef"}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string // "" for accepted
	}{
		{[]string{"--peers", "a@h:1"}, nil, "--peers needs --cluster-addr"},
		{[]string{"--join", "h:1"}, nil, "--join needs --cluster-addr"},
		{[]string{"--cluster-addr", "127.0.0.1:7950"}, nil, "needs the cluster secret"},
		{[]string{"--cluster-addr", "127.0.0.1:7950"}, map[string]string{"NARAD_CLUSTER_SECRET": "short"}, "at least 16 are required"},
		{[]string{"--cluster-addr", "127.0.0.1:7950"}, ok, ""},
		{[]string{"--cluster-addr", "127.0.0.1:7950", "--cluster-secret-file", secretFile}, nil, ""},
		{[]string{"--cluster-addr", "127.0.0.1:7950", "--cluster-secret-file", secretFile}, ok, "exclude each other"},
		{[]string{"--cluster-addr", "127.0.0.1"}, ok, "want host:port"},
		{[]string{"--cluster-addr", "127.0.0.1:0"}, ok, "the port must be"},
		{[]string{"--cluster-addr", "0.0.0.0:7950"}, ok, "--advertise-cluster-addr"},
		{[]string{"--cluster-addr", "0.0.0.0:7950", "--advertise-cluster-addr", "10.0.0.1:7950"}, ok, ""},
		{[]string{"--cluster-addr", "127.0.0.1:7950", "--http-addr", "0.0.0.0:7942"}, ok, "--advertise-addr"},
		{[]string{"--cluster-addr", "127.0.0.1:7950", "--http-addr", "0.0.0.0:7942", "--advertise-addr", "https://n1.example:7942", "--admin-password", "x"}, ok, ""},
		{[]string{"--cluster-addr", "127.0.0.1:7950", "--peers", "n1@127.0.0.1:7950,n2"}, ok, "not id@host:port"},
		{[]string{"--cluster-addr", "127.0.0.1:7950", "--peers", "n1@127.0.0.1:7950,n1@127.0.0.1:7951"}, ok, "twice"},
		{[]string{"--cluster-addr", "127.0.0.1:7950", "--peers", "n1@127.0.0.1:7950", "--join", "127.0.0.1:7951"}, ok, "exclude each other"},
		{[]string{"--cluster-addr", "127.0.0.1:7950", "--join", "127.0.0.1:7951", "--wait-for-add"}, ok, "exclude each other"},
		{[]string{"--cluster-addr", "127.0.0.1:7950"}, map[string]string{"NARAD_CLUSTER_ADDR": "x", "NARAD_CLUSTER_SECRET": "0123456789abcdef", "NARAD_PEERS": "n1@127.0.0.1:7950"}, ""},
	} {
		_, err := loadConfig(tc.args, envOf(tc.env))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v %v: %v, want it accepted", tc.args, tc.env, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v %v: %v, want an error saying %q", tc.args, tc.env, err, tc.want)
		}
	}
}

func TestClusterSecretsFromFilesAndFlags(t *testing.T) {
	dir := t.TempDir()
	cur, next := filepath.Join(dir, "cur"), filepath.Join(dir, "next")
	os.WriteFile(cur, []byte("0123456789abcdef-cur\r\n"), 0o600)
	os.WriteFile(next, nil, 0o600)
	c, err := loadConfig([]string{"--cluster-addr", "127.0.0.1:7950", "--cluster-secret-file", cur, "--cluster-secret-next-file", next}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	a, b, err := c.clusterSecrets()
	if err != nil || string(a) != "0123456789abcdef-cur" || b != nil {
		t.Fatalf("secrets %q %q %v: want the file's line without its break, and no next secret for an empty file", a, b, err)
	}
	os.WriteFile(next, []byte("too short\n"), 0o600)
	if _, _, err := c.clusterSecrets(); err == nil || !strings.Contains(err.Error(), "next cluster secret") {
		t.Fatalf("a short next secret: %v", err)
	}
	// Given as flags, they are remembered for the warning that ps shows them.
	c, err = loadConfig([]string{"--cluster-addr", "127.0.0.1:7950", "--cluster-secret", "0123456789abcdef"}, envOf(nil))
	if err != nil || strings.Join(c.secretFlags, ",") != "--cluster-secret" {
		t.Fatalf("secret flags %v (%v), want --cluster-secret", c.secretFlags, err)
	}
	c, err = loadConfig([]string{"--cluster-addr", "127.0.0.1:7950"}, envOf(map[string]string{"NARAD_CLUSTER_SECRET": "0123456789abcdef"}))
	if err != nil || len(c.secretFlags) != 0 {
		t.Fatalf("secret from the environment: flags %v (%v), want none", c.secretFlags, err)
	}
}
