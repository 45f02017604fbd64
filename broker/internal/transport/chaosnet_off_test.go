//go:build !chaosnet

package transport

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestChaosNetOffIsInert: without the chaosnet tag a rules file named in the environment
// changes nothing: the node plane's socket is the one bound, unwrapped.
func TestChaosNetOffIsInert(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "rules")
	if err := os.WriteFile(rules, []byte("drop in 1\ndrop out 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(ChaosNetEnvVar, rules)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if ChaosNetEnabled || chaosWrap(pc) != pc {
		t.Fatal("a build without the chaosnet tag wrapped the node plane's socket")
	}
}
