package jsonstr

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// FuzzAppendString checks that every string is written as valid JSON that decodes to the
// same text (invalid UTF-8 becomes U+FFFD, as encoding/json does).
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "a\"b\\c", "\n\t\x00\x1f", "é\u2028\u2029", "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := Append(nil, s)
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q -> invalid JSON %s: %v", s, b, err)
		}
		want := s
		if !utf8.ValidString(s) {
			want = toValidUTF8(s)
		}
		if got != want {
			t.Fatalf("%q -> %s -> %q", s, b, got)
		}
	})
}

func toValidUTF8(s string) string {
	out := make([]rune, 0, len(s))
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		out = append(out, r)
		i += n
	}
	return string(out)
}
