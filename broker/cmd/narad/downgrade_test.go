package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/format"
)

// TestDowngradeFormatCommand: usage errors exit 2 and say what is missing; a
// directory already at the format asked for exits 0 and says nothing was done; one
// that holds no data directory exits 1 naming --data-dir.
func TestDowngradeFormatCommand(t *testing.T) {
	noenv := func(string) string { return "" }
	run := func(getenv func(string) string, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := downgradeFormat(args, getenv, &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, _, stderr := run(noenv); code != 2 || !strings.Contains(stderr, "--to is required") {
		t.Errorf("no --to: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := run(noenv, "--to", "2", "extra"); code != 2 || !strings.Contains(stderr, `unexpected argument "extra"`) {
		t.Errorf("an extra argument: exit %d, stderr %q", code, stderr)
	}
	if code, _, _ := run(noenv, "--to", "two"); code != 2 {
		t.Errorf("--to two: exit %d, want 2", code)
	}
	if code, _, stderr := run(noenv, "--to", "-1"); code != 2 || !strings.Contains(stderr, "formats start at 1") {
		t.Errorf("--to -1: exit %d, stderr %q; want 2, a usage error", code, stderr)
	}
	dir := t.TempDir()
	if err := format.Write(dir, format.Stamp{Format: 2}); err != nil {
		t.Fatal(err)
	}
	env := func(k string) string {
		if k == "NARAD_DATA_DIR" {
			return dir
		}
		return ""
	}
	if code, stdout, stderr := run(env, "--to", "2"); code != 0 || !strings.Contains(stdout, "at format 2 already") {
		t.Errorf("a directory at format 2 (from NARAD_DATA_DIR): exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if code, _, stderr := run(noenv, "--to", "2", "--data-dir", t.TempDir()); code != 1 || !strings.Contains(stderr, "check --data-dir") {
		t.Errorf("an empty directory: exit %d, stderr %q", code, stderr)
	}
	file := filepath.Join(dir, "FORMAT")
	if code, _, stderr := run(noenv, "--to", "2", "--data-dir", file); code != 1 || !strings.Contains(stderr, "is not a directory: check --data-dir") {
		t.Errorf("a file as the data directory: exit %d, stderr %q", code, stderr)
	}
}
