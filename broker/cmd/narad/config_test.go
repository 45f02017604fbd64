package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/narad-mq/narad/broker/internal/meta"
)

// TestPrintConfig: --print-config shows the effective value of every setting, from
// flags, NARAD_* variables and the --config file in that order, never a secret's value,
// and YAML that a --config file takes back.
func TestPrintConfig(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "narad.yaml")
	if err := os.WriteFile(file, []byte("segment-bytes: 8192\nlog-level: warn\nmax-connections: 7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"NARAD_CONFIG":         file,
		"NARAD_LOG_LEVEL":      "debug", // beats the file
		"NARAD_ADMIN_PASSWORD": "hunter2-secret",
		"NARAD_CLUSTER_SECRET": "0123456789abcdef-cluster",
	}
	c, err := loadConfig([]string{"--print-config", "--max-connections", "9", "--cluster-addr", "127.0.0.1:7950", "--data-dir", "/srv/a b: c"}, envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	if !c.PrintConfig {
		t.Fatal("--print-config not set")
	}
	var out bytes.Buffer
	if err := printConfig(&out, c); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, secret := range []string{"hunter2-secret", "0123456789abcdef-cluster"} {
		if strings.Contains(text, secret) {
			t.Errorf("the output shows a secret:\n%s", text)
		}
	}
	var got map[string]string
	if err := yaml.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, text)
	}
	for k, want := range map[string]string{
		"segment-bytes":       "8192",           // from the file
		"log-level":           "debug",          // the variable beats the file
		"max-connections":     "9",              // the flag beats the file
		"http-addr":           "127.0.0.1:7942", // a default
		"data-dir":            "/srv/a b: c",
		"admin-password":      "(redacted)",
		"cluster-secret":      "(redacted)",
		"cluster-secret-next": "",
		"sync-mode":           "wal",
		"default-retention":   "168h0m0s",
	} {
		if got[k] != want {
			t.Errorf("%s: printed %q, want %q", k, got[k], want)
		}
	}
	for _, k := range []string{"config", "print-config"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s is printed; it is not a setting", k)
		}
	}
	// Every other setting is printed, so the output is the whole configuration.
	c.flags.VisitAll(func(f *flag.Flag) {
		if _, ok := got[f.Name]; !ok && !notSettings[f.Name] {
			t.Errorf("setting %s is not printed", f.Name)
		}
	})
	// Fed back as a --config file (secrets removed), it gives the same configuration.
	delete(got, "admin-password")
	delete(got, "cluster-secret")
	back, err := yaml.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	file2 := filepath.Join(dir, "back.yaml")
	if err := os.WriteFile(file2, back, 0o600); err != nil {
		t.Fatal(err)
	}
	c2, err := loadConfig([]string{"--config", file2}, envOf(map[string]string{"NARAD_CLUSTER_SECRET": "0123456789abcdef-cluster"}))
	if err != nil {
		t.Fatalf("the printed configuration does not load back: %v\n%s", err, back)
	}
	if c2.SegmentBytes != 8192 || c2.LogLevel != "debug" || c2.MaxConns != 9 || c2.DataDir != "/srv/a b: c" {
		t.Errorf("loaded back: %+v", c2)
	}
}

// TestInvalidConfigNamesTheSetting: a bad value is refused at start, naming the setting
// (flag, variable or config-file key) to fix.
func TestInvalidConfigNamesTheSetting(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "narad.yaml")
	if err := os.WriteFile(file, []byte("segment-bytes: lots\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bogus := filepath.Join(dir, "bogus.yaml")
	if err := os.WriteFile(bogus, []byte("segment-byte: 4096\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--sync-mode", "always"}, nil, "--sync-mode"},
		{nil, map[string]string{"NARAD_LOG_FORMAT": "xml"}, "--log-format"},
		{[]string{"--log-level", "loud"}, nil, "--log-level"},
		{[]string{"--retention-interval", "-1s"}, nil, "--retention-interval"},
		{[]string{"--shutdown-grace", "-1s"}, nil, "--shutdown-grace"},
		{[]string{"--auth-failure-delay", "-1s"}, nil, "--auth-failure-delay"},
		{[]string{"--segment-bytes", "10"}, nil, "--segment-bytes"},
		{[]string{"--stats-interval", "1ms"}, nil, "--stats-interval"},
		{[]string{"--cluster-version-max", strconv.Itoa(meta.VersionMax + 1)}, nil, "--cluster-version-max"},
		{[]string{"--gc-percent", "10"}, nil, "--gc-percent"},
		{nil, map[string]string{"NARAD_GC_PERCENT": "-1"}, "--gc-percent"},
		{nil, map[string]string{"NARAD_CLUSTER_VERSION_MAX": "-1"}, "--cluster-version-max"},
		{nil, map[string]string{"NARAD_STATS_INTERVAL": "2h"}, "--stats-interval"},
		{nil, map[string]string{"NARAD_MAX_CONNECTIONS": "many"}, "NARAD_MAX_CONNECTIONS"},
		{[]string{"--config", file}, nil, "config segment-bytes"},
		{[]string{"--config", bogus}, nil, `unknown setting "segment-byte"`},
	} {
		_, err := loadConfig(tc.args, envOf(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: got %v, want an error naming %s", tc.args, tc.env, err, tc.want)
		}
	}
}

// TestPrintConfigOnlyFromTheCommandLine: a stray NARAD_PRINT_CONFIG or config-file key
// must not turn a node's start into an exit.
func TestPrintConfigOnlyFromTheCommandLine(t *testing.T) {
	c, err := loadConfig(nil, envOf(map[string]string{"NARAD_PRINT_CONFIG": "true"}))
	if err != nil || c.PrintConfig {
		t.Errorf("NARAD_PRINT_CONFIG: print %v, err %v; want it ignored", c.PrintConfig, err)
	}
	file := filepath.Join(t.TempDir(), "narad.yaml")
	if err := os.WriteFile(file, []byte("print-config: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig([]string{"--config", file}, envOf(nil)); err == nil || !strings.Contains(err.Error(), `unknown setting "print-config"`) {
		t.Errorf("print-config in the file: got %v, want it refused as an unknown setting", err)
	}
}

// The collector's target: --gc-percent (or NARAD_GC_PERCENT) wins, then Go's own GOGC,
// then the broker's default.
func TestGCPercent(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		gogc string
		want int
	}{
		{nil, "", defaultGCPercent},
		{nil, "100", 0}, // the runtime already applied GOGC
		{nil, "off", 0},
		{map[string]string{"NARAD_GC_PERCENT": "150"}, "", 150},
		{map[string]string{"NARAD_GC_PERCENT": "150"}, "100", 150},
	} {
		c, err := loadConfig(nil, envOf(tc.env))
		if err != nil {
			t.Fatal(err)
		}
		if got := gcPercent(c.GCPercent, tc.gogc); got != tc.want {
			t.Errorf("%v, GOGC=%q: %d, want %d", tc.env, tc.gogc, got, tc.want)
		}
	}
}

// TestWALProcessors: with the write-ahead writer holding its processor (the default),
// serve runs Go with one processor more than its default; not when the holding is off,
// in another sync mode, or when GOMAXPROCS is set.
func TestWALProcessors(t *testing.T) {
	for _, tc := range []struct {
		env        map[string]string
		gomaxprocs string
		want       int
	}{
		{nil, "", 3},
		{nil, "2", 0},
		{map[string]string{"NARAD_WAL_HOLD_PROCESSOR": "false"}, "", 0},
		{map[string]string{"NARAD_SYNC_MODE": "group"}, "", 0},
	} {
		c, err := loadConfig(nil, envOf(tc.env))
		if err != nil {
			t.Fatal(err)
		}
		if got := walProcessors(c, tc.gomaxprocs, 2); got != tc.want {
			t.Errorf("%v, GOMAXPROCS=%q, 2 processors: %d, want %d", tc.env, tc.gomaxprocs, got, tc.want)
		}
	}
}
