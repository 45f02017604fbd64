package narad_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// TestAdaptersRequireAReleasedSDK: the otel and prometheus modules must require a real
// release of the SDK. v0.0.0 (what they required, satisfied only by their replace, which
// `go get` ignores in a dependency) can never be fetched, so neither module installed.
// Each must still build on its own (GOWORK=off), through its in-repo replace.
func TestAdaptersRequireAReleasedSDK(t *testing.T) {
	require := regexp.MustCompile(`(?m)^\s*(?:require\s+)?github\.com/narad-mq/narad/sdk-go\s+(v\S+)`)
	semver := regexp.MustCompile(`^v\d+\.\d+\.\d+$`)
	for _, mod := range []string{"otel", "prometheus"} {
		gomod, err := os.ReadFile(filepath.Join(mod, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		m := require.FindSubmatch(gomod)
		if m == nil {
			t.Fatalf("%s/go.mod does not require github.com/narad-mq/narad/sdk-go", mod)
		}
		if v := string(m[1]); !semver.MatchString(v) || v == "v0.0.0" {
			t.Errorf("%s/go.mod requires sdk-go %s: require a released version (tag sdk-go/vX.Y.Z)", mod, v)
		}
		build := exec.Command("go", "build", "./...")
		build.Dir = mod
		build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
		if out, err := build.CombinedOutput(); err != nil {
			t.Errorf("%s: GOWORK=off go build ./...: %v\n%s", mod, err, out)
		}
	}
}
