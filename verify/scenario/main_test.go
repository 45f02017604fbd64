package scenario

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMain removes the narad the tests built (Binary), which lives in its own
// temporary directory.
func TestMain(m *testing.M) {
	code := m.Run()
	if builtBin != "" && os.Getenv("NARAD_FAILPOINT_BIN") == "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}
