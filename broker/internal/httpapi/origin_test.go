package httpapi

import (
	"crypto/tls"
	"net/http/httptest"
	"testing"
)

func TestHostRules(t *testing.T) {
	t.Parallel()
	r := newHostRules([]string{"Narad.Internal.", ".svc.example", " "})
	for host, want := range map[string]bool{
		"":                     true,
		"127.0.0.1:7942":       true,
		"[::1]:7942":           true,
		"::1":                  true,
		"10.0.0.5":             true,
		"localhost":            true,
		"LOCALHOST.:7942":      true,
		"app.localhost:7942":   true,
		"narad.internal:7942":  true,
		"narad.internal.":      true,
		"a.b.svc.example:1":    true,
		"svc.example":          false, // the leading dot allows subdomains only
		"evil.example":         false,
		"localhost.evil.com":   false,
		"127.0.0.1.evil.com":   false,
		"xsvc.example.evil:80": false,
	} {
		if got := r.allows(host); got != want {
			t.Errorf("allows(%q) = %v, want %v", host, got, want)
		}
	}
	if !newHostRules([]string{"*"}).allows("anything.example") {
		t.Error(`"*" does not allow every host`)
	}
}

func TestSameOrigin(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		origin, host string
		tls          bool
		want         bool
	}{
		{"http://127.0.0.1:7942", "127.0.0.1:7942", false, true},
		{"http://LOCALHOST:7942", "localhost:7942", false, true},
		{"http://broker", "broker:80", false, true},
		{"https://broker", "broker", true, true},
		{"https://broker:443", "broker", true, true},
		{"http://127.0.0.1:7942", "127.0.0.1:7942", true, false}, // scheme differs
		{"http://127.0.0.1:1", "127.0.0.1:7942", false, false},
		{"null", "127.0.0.1:7942", false, false},
		{"file://", "127.0.0.1:7942", false, false},
		{"http://[::1]:7942", "[::1]:7942", false, true},
	} {
		r := httptest.NewRequest("POST", "/v1/topics", nil)
		r.Host = c.host
		if c.tls {
			r.TLS = &tls.ConnectionState{}
		}
		if got := sameOrigin(c.origin, r); got != c.want {
			t.Errorf("sameOrigin(%q, Host %q, tls %v) = %v, want %v", c.origin, c.host, c.tls, got, c.want)
		}
	}
}
