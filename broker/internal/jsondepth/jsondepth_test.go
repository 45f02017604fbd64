package jsondepth

import (
	"strings"
	"testing"
)

func nest(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

func TestExceeds(t *testing.T) {
	cases := []struct {
		text string
		max  int
		want bool
	}{
		{`1`, 0, false},
		{`[]`, 0, true},
		{`[]`, 1, false},
		{nest(128), 128, false},
		{nest(129), 128, true},
		{`{"a":{"b":[1,{"c":2}]}}`, 4, false},
		{`{"a":{"b":[1,{"c":2}]}}`, 3, true},
		// Brackets inside strings, escaped quotes included, do not count.
		{`["[[[[", "\"[[[[", "\\", {"k[":"]]]"}]`, 2, false},
		{`"` + strings.Repeat("[", 1000) + `"`, 0, false},
		{`[` + strings.Repeat(`"\"",`, 10) + nest(2) + `]`, 2, true},
		// Siblings do not add up.
		{`[` + strings.Repeat(nest(3)+",", 50) + `1]`, 4, false},
	}
	for _, c := range cases {
		if got := Exceeds([]byte(c.text), c.max); got != c.want {
			t.Errorf("Exceeds(%.40q, %d) = %v, want %v", c.text, c.max, got, c.want)
		}
	}
	// Input that is not JSON returns, whatever the answer.
	for _, s := range []string{`"`, `"\`, `]]]]`, `[[["`, "\\"} {
		Exceeds([]byte(s), 2)
	}
}

// BenchmarkExceeds256 is the cost on a typical 256-byte event.
func BenchmarkExceeds256(b *testing.B) {
	p := []byte(`{"id":"7c0b9c3e-8f1a-4a52-9a57-0d2f3b1d9e41","type":"order.created","at":"2025-11-24T10:15:00Z","customer":{"id":42,"tier":"gold"},"items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"total":{"amount":1999,"currency":"EUR"},"note":"leave at the door"}`)
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if Exceeds(p, 128) {
			b.Fatal("a flat event exceeds 128")
		}
	}
}
