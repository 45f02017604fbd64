package auth

import (
	"errors"
	"testing"
)

func validName(s string) bool {
	if s == "" || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func TestMatchEdges(t *testing.T) {
	cases := []struct {
		p, topic string
		want     bool
	}{
		{"a", "a", true}, {"a", "ab", false}, {"a", "a.b", false},
		{"a.*", "a", false}, {"a.*", "ab", false}, {"a.*", "a.", false}, {"a.*", "a.b", true}, {"a.*", "a.b.c", true},
		{"a.b.*", "a.b", false}, {"a.b.*", "a.bc", false}, {"a.b.*", "a.b.c", true},
		{"*", "anything", true},
	}
	for _, c := range cases {
		if got := Match(c.p, c.topic); got != c.want {
			t.Errorf("Match(%q, %q) = %v", c.p, c.topic, got)
		}
	}
}

func TestCoversNoEscalation(t *testing.T) {
	u := &User{Grants: []Grant{{Action: Produce, Topics: []string{"a.*", "x"}}, {Action: Consume, Topics: []string{"a.b.*"}}}}
	ok := [][]Grant{
		{{Action: Produce, Topics: []string{"a.b"}}},
		{{Action: Produce, Topics: []string{"a.b.*"}}},
		{{Action: Produce, Topics: []string{"x"}}},
		{{Action: Consume, Topics: []string{"a.b.c.*", "a.b.c"}}},
	}
	for _, gs := range ok {
		if !u.Covers(gs) {
			t.Errorf("should cover %+v", gs)
		}
	}
	escalations := [][]Grant{
		{{Action: Produce, Topics: []string{"*"}}},
		{{Action: Produce, Topics: []string{"a"}}},
		{{Action: Produce, Topics: []string{"ab.*"}}},
		{{Action: Produce, Topics: []string{"x.*"}}},
		{{Action: Consume, Topics: []string{"a.*"}}},
		{{Action: Create, Topics: []string{"a.b"}}},
		{{Action: Admin, Topics: []string{"a.b"}}},
		{{Action: Produce, Topics: []string{"a.b", "y"}}},
	}
	for _, gs := range escalations {
		if u.Covers(gs) {
			t.Errorf("escalation allowed: %+v", gs)
		}
	}
	admin := &User{Grants: []Grant{{Action: Admin, Topics: []string{"*"}}}}
	if !admin.Covers(escalations[0]) || !admin.IsAdmin() || u.IsAdmin() {
		t.Error("admin rules")
	}
	scoped := &User{Grants: []Grant{{Action: Admin, Topics: []string{"inv.*"}}}}
	if scoped.IsAdmin() || !scoped.Can(Consume, "inv.x") || scoped.Can(Consume, "other") {
		t.Error("scoped admin rules")
	}
}

func TestCanAndSee(t *testing.T) {
	u := &User{Grants: []Grant{{Action: Produce, Topics: []string{"orders"}}}}
	if !u.Can(Produce, "orders") || u.Can(Consume, "orders") || u.Can(Produce, "orders2") {
		t.Error("Can")
	}
	if !u.CanSee("orders") || u.CanSee("other") {
		t.Error("CanSee")
	}
}

func TestChecks(t *testing.T) {
	for _, p := range []string{"", "a*", "*.*", ".*", "a/.*", "a.*.*", "a b"} {
		if err := CheckPattern(p, validName); !errors.Is(err, ErrInvalid) {
			t.Errorf("pattern %q accepted", p)
		}
	}
	for _, p := range []string{"*", "a", "a.*", "a.b-c_d.*"} {
		if err := CheckPattern(p, validName); err != nil {
			t.Errorf("pattern %q: %v", p, err)
		}
	}
	if CheckGrants([]Grant{{Action: "root", Topics: []string{"*"}}}, validName) == nil {
		t.Error("unknown action accepted")
	}
	if CheckGrants([]Grant{{Action: Produce}}, validName) == nil {
		t.Error("grant without topics accepted")
	}
	for _, pw := range []string{"short", string(make([]byte, 73)), "\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8", "pass\ufffdword"} {
		if CheckPassword(pw) == nil {
			t.Errorf("password %q accepted", pw)
		}
	}
	for _, n := range []string{"", "a b", "é", "a/b", string(make([]byte, 129))} {
		if CheckUsername(n) == nil {
			t.Errorf("username %q accepted", n)
		}
	}
	if CheckUsername("alice@example.com") != nil || CheckPassword("correct horse") != nil || CheckPassword("pässwörd-日本") != nil {
		t.Error("valid ones refused")
	}
}
