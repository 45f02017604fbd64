package format

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)) }

func mustRead(t *testing.T, dir string) Stamp {
	t.Helper()
	st, found, err := Read(dir)
	if err != nil || !found {
		t.Fatalf("Read(%s) = %+v, found %v, err %v; want a FORMAT file", dir, st, found, err)
	}
	return st
}

// A new directory (missing, or empty) gets the current format at once, with the
// binary's name; a second Prepare finds it and changes nothing.
func TestNewDirectoryGetsCurrent(t *testing.T) {
	for _, name := range []string{"missing", "empty"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			if name == "empty" {
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			res, err := Prepare(dir, Options{WrittenBy: "narad test-1", Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			if res.Found != 0 || res.Upgraded {
				t.Errorf("Prepare on a new directory = %+v, want Found 0, not upgraded", res)
			}
			if st := mustRead(t, dir); st != (Stamp{Format: Current, WrittenBy: "narad test-1"}) {
				t.Errorf("FORMAT = %+v, want format %d written by narad test-1", st, Current)
			}
			b, err := os.ReadFile(filepath.Join(dir, FileName))
			if err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf(`{"format":%d,"written_by":"narad test-1"}`+"\n", Current); string(b) != want {
				t.Errorf("FORMAT holds %q, want %q", b, want)
			}
			res, err = Prepare(dir, Options{WrittenBy: "narad test-2", Logger: quiet()})
			if err != nil || res.Found != Current || res.Upgraded {
				t.Errorf("second Prepare = %+v, %v; want Found %d, not upgraded", res, err, Current)
			}
			if st := mustRead(t, dir); st.WrittenBy != "narad test-1" {
				t.Errorf("a Prepare that changed nothing rewrote FORMAT: %+v", st)
			}
		})
	}
}

// formatOneDir makes a directory as a format-1 binary left it: data, no FORMAT file,
// files 0644 and directories 0755.
func formatOneDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	part := filepath.Join(dir, "topics", "9-t", "0", "log")
	if err := os.MkdirAll(part, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Join(dir, "node-id"), filepath.Join(part, "00000000000000000000.log")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{dir, filepath.Join(dir, "topics"), filepath.Join(dir, "topics", "9-t"), filepath.Join(dir, "topics", "9-t", "0"), part} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A directory with data and no FORMAT file is format 1: it is upgraded (modes
// tightened, every step logged) and FORMAT reads the current format afterwards.
func TestFormatOneUpgraded(t *testing.T) {
	dir := formatOneDir(t)
	var logs bytes.Buffer
	res, err := Prepare(dir, Options{WrittenBy: "narad test-1", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if res.Found != 1 || !res.Upgraded {
		t.Errorf("Prepare = %+v, want Found 1, upgraded", res)
	}
	if st := mustRead(t, dir); st.Format != Current {
		t.Errorf("FORMAT after the upgrade = %+v, want format %d", st, Current)
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s is %v after the upgrade, want no group or other bits", p, info.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"upgrading the data directory", "from_format=1", "to_format=2", "recovery-point", "owner IDs", "restore a backup", "data directory upgraded"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the upgrade's log lacks %q:\n%s", want, logs.String())
		}
	}
}

// TestUpgradeLogNamesTheWayBack: the upgrade's log says how to go back to the binary
// of the directory's format. From format 2 that is narad downgrade-format, not the
// backup: restored on a cluster node, a backup brings back a Raft vote and log the
// cluster has moved past (docs/operating/upgrades.md). A step without its undo still
// needs the backup, and the log says how far the downgrade goes.
func TestUpgradeLogNamesTheWayBack(t *testing.T) {
	upgrade := func(t *testing.T, from, current int, steps []step) string {
		t.Helper()
		dir := t.TempDir()
		if err := Write(dir, Stamp{Format: from}); err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		if _, err := prepare(dir, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, current, steps); err != nil {
			t.Fatal(err)
		}
		return logs.String()
	}
	logs := upgrade(t, 2, Current, steps)
	if !strings.Contains(logs, "narad downgrade-format --to 2") || strings.Contains(logs, "restore a backup") {
		t.Errorf("the upgrade from format 2 logs\n%s\nwant the way back by narad downgrade-format --to 2, not by a backup", logs)
	}
	noop := func(string, *slog.Logger) error { return nil }
	fake := []step{{to: 2, what: "two", run: noop}, {to: 3, what: "three", run: noop}, {to: 4, what: "four", run: noop, down: noop}}
	logs = upgrade(t, 2, 4, fake)
	if !strings.Contains(logs, "restore a backup") || !strings.Contains(logs, "narad downgrade-format --to 3 takes the directory back as far as format 3") {
		t.Errorf("an upgrade from 2 to 4 whose step to 3 has no undo logs\n%s\nwant the backup, and the downgrade as far as format 3", logs)
	}
}

// A data directory given as a symbolic link is upgraded all the same.
func TestFormatOneUpgradedThroughSymlink(t *testing.T) {
	dir := formatOneDir(t)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if res, err := Prepare(link, Options{Logger: quiet()}); err != nil || !res.Upgraded {
		t.Fatalf("Prepare through a link = %+v, %v", res, err)
	}
	info, err := os.Stat(filepath.Join(dir, "node-id"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("node-id is %v after an upgrade through a link, want 0600", info.Mode().Perm())
	}
}

// A directory whose format is newer than the binary knows is refused, naming both
// formats, and left as it was.
func TestNewerFormatRefused(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, Stamp{Format: Current + 1, WrittenBy: "narad 9.9.9"}); err != nil {
		t.Fatal(err)
	}
	_, err := Prepare(dir, Options{WrittenBy: "narad test-1", Logger: quiet()})
	if !errors.Is(err, ErrTooNew) {
		t.Fatalf("Prepare on format %d = %v, want ErrTooNew", Current+1, err)
	}
	for _, want := range []string{fmt.Sprintf("at format %d", Current+1), "narad 9.9.9", "narad test-1", fmt.Sprintf("knows formats up to %d", Current), "restore a backup", fmt.Sprintf("narad downgrade-format --to %d", Current)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	if st := mustRead(t, dir); st.Format != Current+1 {
		t.Errorf("the refused directory's FORMAT became %+v", st)
	}
}

// A FORMAT file that cannot be read is refused rather than guessed at.
func TestUnreadableFormatRefused(t *testing.T) {
	for _, body := range []string{"", "2", `{"format":0}`, `{"format":"2"}`, "\x00\x00garbage"} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, FileName), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Prepare(dir, Options{Logger: quiet()}); !errors.Is(err, ErrUnreadable) {
			t.Errorf("FORMAT %q: Prepare = %v, want ErrUnreadable", body, err)
		}
	}
}

// Unknown fields (a later binary may add some) are ignored; a leftover temporary file
// from a crash during Write is overwritten.
func TestReadWrite(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName+".tmp"), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(dir, Stamp{Format: 7, WrittenBy: "x"}); err != nil {
		t.Fatal(err)
	}
	if st := mustRead(t, dir); st != (Stamp{Format: 7, WrittenBy: "x"}) {
		t.Errorf("Read after Write = %+v", st)
	}
	if _, err := os.Stat(filepath.Join(dir, FileName+".tmp")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the temporary file is still there: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte(`{"format":2,"later":{"a":1}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if st := mustRead(t, dir); st.Format != 2 {
		t.Errorf("Read with an unknown field = %+v", st)
	}
	info, err := os.Stat(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("FORMAT is %v, want 0600", info.Mode().Perm())
	}
}

// Steps run in order from the directory's format; a failed step leaves the old format
// (so the next start runs the steps again) and a step that needs confirmation is
// refused without AllowUpgrade.
func TestSteps(t *testing.T) {
	var ran []int
	mk := func(to int, confirm bool, fail error) step {
		return step{to: to, what: "test", confirm: confirm, run: func(string, *slog.Logger) error {
			ran = append(ran, to)
			return fail
		}}
	}
	dir := t.TempDir()
	if err := Write(dir, Stamp{Format: 2}); err != nil {
		t.Fatal(err)
	}
	opts := Options{Logger: quiet()}

	boom := errors.New("boom")
	ran = nil
	_, err := prepare(dir, opts, 4, []step{mk(2, false, nil), mk(3, false, nil), mk(4, false, boom)})
	if !errors.Is(err, ErrUpgradeFailed) || !errors.Is(err, boom) {
		t.Errorf("a failed step: %v, want ErrUpgradeFailed wrapping its error", err)
	}
	if st := mustRead(t, dir); st.Format != 2 {
		t.Errorf("after a failed step FORMAT = %+v, want the old format 2", st)
	}
	if len(ran) != 2 || ran[0] != 3 || ran[1] != 4 {
		t.Errorf("steps run from format 2 = %v, want [3 4]", ran)
	}

	ran = nil
	_, err = prepare(dir, opts, 4, []step{mk(2, false, nil), mk(3, false, nil), mk(4, true, nil)})
	if !errors.Is(err, ErrNeedsUpgrade) || !strings.Contains(err.Error(), "--upgrade-format") {
		t.Errorf("a step that needs confirmation, without it: %v, want ErrNeedsUpgrade naming --upgrade-format", err)
	}
	if len(ran) != 0 {
		t.Errorf("steps ran before the refusal: %v; want none, so the directory is untouched", ran)
	}

	ran = nil
	opts.AllowUpgrade = true
	res, err := prepare(dir, opts, 4, []step{mk(2, false, nil), mk(3, false, nil), mk(4, true, nil)})
	if err != nil || !res.Upgraded || res.Found != 2 {
		t.Fatalf("with AllowUpgrade: %+v, %v", res, err)
	}
	if st := mustRead(t, dir); st.Format != 4 {
		t.Errorf("FORMAT after the upgrade = %+v, want 4", st)
	}
}

// The table of steps covers every format from 1 to Current, in order.
func TestStepTable(t *testing.T) {
	if len(steps) != Current-1 {
		t.Fatalf("%d upgrade steps for formats 1 to %d; every format bump needs its step", len(steps), Current)
	}
	for i, s := range steps {
		if s.to != i+2 || s.run == nil || s.what == "" {
			t.Errorf("steps[%d] = to %d, run set %v, what %q; want to %d with a run and a description", i, s.to, s.run != nil, s.what, i+2)
		}
	}
}
