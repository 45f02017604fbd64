//go:build cluster

package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// previousRelease is the commit whose binary is release N of the upgrade test: the last
// one before cluster versions (it speaks version 1 and knows none of version 2's
// operations). Move it to the newest release's tag when there is one;
// NARAD_UPGRADE_FROM overrides it for a run.
const previousRelease = "f30a74d"

// releaseFormat reads the newest data-directory format commit rev knows (its
// format.Current), which a node's directory is taken back to before rev runs on it.
func releaseFormat(t *testing.T, rev string) int {
	t.Helper()
	mod, err := testutil.BrokerModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	src, err := exec.Command("git", "-C", filepath.Dir(mod), "show", rev+":broker/internal/storage/format/format.go").Output()
	if err != nil {
		t.Fatalf("reading the format package of %s: %v", rev, err)
	}
	m := regexp.MustCompile(`(?m)^const Current = (\d+)$`).FindSubmatch(src)
	if m == nil {
		t.Fatalf("no \"const Current = N\" in the format package of %s", rev)
	}
	n, err := strconv.Atoi(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// buildRelease builds narad from commit rev of this repository into a temporary
// directory: the broker and Go SDK modules of that commit, by git archive (nothing of
// the working tree), with the module cache and proxy as any build uses them.
func buildRelease(t *testing.T, rev string) string {
	t.Helper()
	mod, err := testutil.BrokerModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(mod)
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", rev+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("commit %s (release N of the upgrade test) is not in this clone (%v %s): a shallow CI checkout must fetch it, e.g. git fetch --unshallow, or set NARAD_UPGRADE_FROM to a commit it has", rev, err, out)
	}
	dir := t.TempDir()
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", rev, "broker", "sdk-go")
	var tarball, stderr bytes.Buffer
	archive.Stdout, archive.Stderr = &tarball, &stderr
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v %s", rev, err, stderr.String())
	}
	untar := exec.Command("tar", "-x", "-C", dir)
	untar.Stdin = &tarball
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("unpacking %s: %v %s", rev, err, out)
	}
	bin := filepath.Join(dir, "narad-"+rev)
	build := exec.Command("go", "build", "-o", bin, "./cmd/narad")
	build.Dir = filepath.Join(dir, "broker")
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building narad at %s: %v\n%s", rev, err, out)
	}
	return bin
}

// TestClusterRollingUpgradeFromPreviousRelease: N → N+1 under load with N the previous
// release itself, built from git: its nodes know nothing of cluster versions (they
// report no range and would halt at set_cluster_version), and a rollback to it before
// the commit is the real one: N knows data-directory format 2 only, so the node's
// directory goes back through `narad downgrade-format` first.
func TestClusterRollingUpgradeFromPreviousRelease(t *testing.T) {
	t.Parallel()
	rev := previousRelease
	if v := strings.TrimSpace(os.Getenv("NARAD_UPGRADE_FROM")); v != "" {
		rev = v
	}
	prev := release{name: "N (commit " + rev + ")", bin: buildRelease(t, rev), format: releaseFormat(t, rev)}
	rollingUpgrade(t, prev, thisRelease, false)
}
