package broker

import (
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var nameRule = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)

// FuzzTopicName checks the topic name rule against its documented form (1 to 249
// characters of a-z A-Z 0-9 . _ -, not . or ..), and that an accepted name is one plain
// path component: a topic's directory can never leave the data directory.
func FuzzTopicName(f *testing.F) {
	for _, s := range []string{"orders", "orders.eu-1_x", ".", "..", "...", "", "a/b", "a\\b", "%2F", "a\x00b", "é", strings.Repeat("a", 249), strings.Repeat("a", 250), "..a", " a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		ok := ValidTopicName(name)
		want := nameRule.MatchString(name) && name != "." && name != ".."
		if ok != want {
			t.Fatalf("ValidTopicName(%q) = %v, the documented rule says %v", name, ok, want)
		}
		err := checkName(name)
		if (err == nil) != ok {
			t.Fatalf("checkName(%q) = %v, ValidTopicName %v", name, err, ok)
		}
		var inv *InvalidError
		if err != nil && !errors.As(err, &inv) {
			t.Fatalf("checkName(%q) = %T %v, want an invalid-name error", name, err, err)
		}
		if ok {
			dir := filepath.Join("/data/topics", "7-"+name)
			if filepath.Dir(dir) != "/data/topics" || filepath.Base(dir) != "7-"+name {
				t.Fatalf("topic %q would live at %s, outside its parent directory", name, dir)
			}
		}
	})
}
