package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRemoteUpdateSendsThePasswordWithANewURLOrCA: the broker sends a remote child's
// stored password only where it went before, so remote-update reads the password
// (--remote-password-file, else NARAD_REMOTE_PASSWORD) for a new URL or CA too, and
// without it is a usage error that sends nothing.
func TestRemoteUpdateSendsThePasswordWithANewURLOrCA(t *testing.T) {
	const child = `{"name":"copy","id":"remote:3","state":"running","remote":{"url":"http://dr2:7942","topic":"copy","username":"copier"}}`
	f := &fakeAPI{answers: map[string]fakeAnswer{"PATCH /v1/topics/orders/children/remote:3": {200, child}}}
	for _, args := range [][]string{
		{"--remote-url", "http://dr2:7942"},
		{"--remote-system-ca"},
	} {
		r := runAgainst(t, f, append([]string{"topic", "remote-update", "orders", "remote:3"}, args...)...)
		if r.code != ExitUsage || !strings.Contains(r.stderr, "NARAD_REMOTE_PASSWORD") {
			t.Errorf("%v without a password: exit %d, stderr %q; want a usage error asking for it", args, r.code, r.stderr)
		}
	}
	if got := f.sent(); len(got) != 0 {
		t.Fatalf("sent without the password: %q", got)
	}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("copier-pass-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runAgainst(t, f, "topic", "remote-update", "orders", "remote:3", "--remote-url", "http://dr2:7942", "--remote-password-file", pw)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if got := f.sent(); len(got) != 1 || !strings.Contains(got[0], `"url":"http://dr2:7942"`) || !strings.Contains(got[0], `"password":"copier-pass-2"`) {
		t.Fatalf("sent %q", got)
	}
}
