package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

func TestParseInterspersed(t *testing.T) {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	n := fs.Int("n", 0, "")
	pos, err := parseInterspersed(fs, []string{"a", "-n", "3", "b", "--", "-n", "c"})
	if err != nil || *n != 3 || !slices.Equal(pos, []string{"a", "b", "-n", "c"}) {
		t.Fatalf("pos %q n %d err %v", pos, *n, err)
	}
}

func TestHumanDurations(t *testing.T) {
	for d, want := range map[time.Duration]string{12 * time.Hour: "12h", 30 * time.Second: "30s", 90 * time.Minute: "1h30m", 0: "0s", 1500 * time.Millisecond: "1.5s"} {
		if got := human(d); got != want {
			t.Errorf("human(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestParseTime(t *testing.T) {
	now := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	if got, err := parseTime("15m", now); err != nil || !got.Equal(now.Add(-15*time.Minute)) {
		t.Fatalf("15m: %v %v", got, err)
	}
	if got, err := parseTime("2024-05-01T10:00:00Z", now); err != nil || got.Hour() != 10 {
		t.Fatalf("rfc3339: %v %v", got, err)
	}
	var ue *usageError
	if _, err := parseTime("yesterday", now); !errors.As(err, &ue) {
		t.Fatalf("bad time: %v", err)
	}
}

func TestExitCodes(t *testing.T) {
	for err, want := range map[error]int{
		fmt.Errorf("x: %w", narad.ErrNotFound):        ExitNotFound,
		fmt.Errorf("x: %w", narad.ErrUnauthenticated): ExitUnauthorized,
		fmt.Errorf("x: %w", narad.ErrForbidden):       ExitUnauthorized,
		fmt.Errorf("x: %w", narad.ErrUnavailable):     ExitUnavailable,
		fmt.Errorf("x: %w", narad.ErrTimeout):         ExitUnavailable,
		fmt.Errorf("x: %w", narad.ErrConflict):        ExitFailed,
		fmt.Errorf("x: %w", narad.ErrNotImplemented):  ExitFailed,
		usagef("bad"):                    ExitUsage,
		fmt.Errorf("x: %w", errNotFound): ExitNotFound,
	} {
		if got := exitCode(err); got != want {
			t.Errorf("exitCode(%v) = %d, want %d", err, got, want)
		}
	}
}

// TestRawNeverDumpsBinaryToATerminal: raw output writes text to a terminal, but refuses
// bytes that could be escape sequences or garbage, while a pipe gets them exactly.
func TestRawNeverDumpsBinaryToATerminal(t *testing.T) {
	if !printable([]byte("héllo\tworld\n")) || printable([]byte{0xff, 0}) || printable([]byte("\x1b[2J")) {
		t.Fatal("printable misjudges")
	}
	var out bytes.Buffer
	w := &messageWriter{e: &env{IO: IO{Stdout: &out, StdoutIsTerminal: true}}, format: "raw"}
	if err := w.writeBytes([]byte("\x1b[2Jgotcha")); !errors.Is(err, errBinaryToTerminal) || out.Len() != 0 {
		t.Fatalf("terminal got %q, err %v", out.String(), err)
	}
	if err := w.writeBytes([]byte("text")); err != nil || out.String() != "text\n" {
		t.Fatalf("terminal text %q %v", out.String(), err)
	}
	out.Reset()
	w.e.StdoutIsTerminal = false
	if err := w.writeBytes([]byte{0, 0xff}); err != nil || !bytes.Equal(out.Bytes(), []byte{0, 0xff, '\n'}) {
		t.Fatalf("pipe got %q %v", out.Bytes(), err)
	}
}

// TestContextsFileIsPrivate: the contexts file may hold passwords, so it is 0600 in a
// 0700 directory, and credentials resolve flags, then variables, then the context.
func TestContextsFileIsPrivate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "contexts.json")
	vars := map[string]string{"NARAD_CLI_CONFIG": path}
	getenv := func(k string) string { return vars[k] }
	var stdout, stderr bytes.Buffer
	io := IO{Stdout: &stdout, Stderr: &stderr, Getenv: getenv, Stdin: strings.NewReader("")}
	if code := Run(context.Background(), []string{"context", "add", "prod", "--url", "http://a:1,http://b:2", "--user", "u", "--password", "p"}, io); code != 0 {
		t.Fatalf("add: %d %s", code, stderr.String())
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("file mode %v %v", st, err)
	}
	if st, err := os.Stat(filepath.Dir(path)); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v %v", st, err)
	}
	e := &env{IO: io, g: &globals{}}
	tg, err := e.target()
	if err != nil || !slices.Equal(tg.URLs, []string{"http://a:1", "http://b:2"}) || tg.User != "u" || tg.Password != "p" {
		t.Fatalf("from the context: %+v %v", tg, err)
	}
	vars["NARAD_URL"], vars["NARAD_USER"], vars["NARAD_PASSWORD"] = "http://env:3", "envu", "envp"
	if tg, _ := e.target(); tg.URLs[0] != "http://env:3" || tg.User != "envu" || tg.Password != "envp" {
		t.Fatalf("variables over the context: %+v", tg)
	}
	e.g = &globals{urls: stringList{"http://flag:4"}, user: "flagu", password: "flagp"}
	if tg, _ := e.target(); tg.URLs[0] != "http://flag:4" || tg.User != "flagu" || tg.Password != "flagp" {
		t.Fatalf("flags over variables: %+v", tg)
	}
}

// TestEveryLeafHasUsageAndFlagsParse walks the command table: every leaf sets up
// without panicking and --help exits 0.
func TestEveryLeafHasUsageAndFlagsParse(t *testing.T) {
	for _, n := range walk() {
		if n.cmd == nil || n.cmd.setup == nil {
			continue
		}
		var out bytes.Buffer
		code := Run(context.Background(), append(slices.Clone(n.path), "--help"), IO{Stdout: &out, Stderr: &out})
		if code != 0 || !strings.Contains(out.String(), "usage: narad "+strings.Join(n.path, " ")) {
			t.Errorf("%v --help: %d %s", n.path, code, out.String())
		}
	}
}

// TestTableOutputQuotesAKeyThatIsNotPlainText: the table form of a message is for a
// terminal; a key carrying escape sequences (or a tab or newline, which would shift
// the columns) is shown quoted. The payload was guarded, the key written as it came.
func TestTableOutputQuotesAKeyThatIsNotPlainText(t *testing.T) {
	var out bytes.Buffer
	w := &messageWriter{e: &env{IO: IO{Stdout: &out, StdoutIsTerminal: true}}, format: "table"}
	if err := w.write(&narad.Message{Partition: 1, Offset: 2, Key: "\x1b[2Jred\tx"}); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "1\t2\t\"\\x1b[2Jred\\tx\"\t\n"; got != want {
		t.Fatalf("table line %q, want %q", got, want)
	}
	out.Reset()
	if err := w.write(&narad.Message{Key: "customer-7 é"}); err != nil || out.String() != "0\t0\tcustomer-7 é\t\n" {
		t.Fatalf("a plain key: %q %v", out.String(), err)
	}
}
