package httpapi

import (
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/narad-mq/narad/broker/internal/broker"
)

// FuzzQueryParams feeds one string to every query parameter parser: wait, extend,
// payload_encoding and from_time. None may panic; wait must land in [0, 20s], extend in
// [0, 12h] or be true/false and be at most 32 characters (extend also comes in
// ack-batch bodies, where no query check runs), and an accepted bare integer must mean what the docs say
// (seconds for wait, milliseconds for extend, Unix ms for from_time).
func FuzzQueryParams(f *testing.F) {
	for _, s := range []string{"", "0", "10", "10s", "500ms", "20s", "21s", "-1", "-1s", "1e3", "true", "false", "base64", "auto",
		"9223372036854775807", "-9223372036854775808", "99999999999999999999", "2026-01-02T15:04:05Z", "2026-01-02T15:04:05.123+05:30",
		"1h1m", "0x10", "+5", " 5", "5 ", "1.5s", "12h", "12h0m0.000000001s", "NaN", "\x00", "µs",
		strings.Repeat("0", 32), strings.Repeat("0", 33)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if d, err := parseWait(&s); err == nil {
			if d < 0 || d > broker.MaxWait {
				t.Fatalf("parseWait(%q) = %v, outside [0, %v]", s, d, broker.MaxWait)
			}
			if n, err := strconv.ParseInt(s, 10, 64); err == nil && d != time.Duration(n)*time.Second {
				t.Fatalf("parseWait(%q) = %v, want %d s", s, d, n)
			}
		} else if toAPIError(err).status != 400 {
			t.Fatalf("parseWait(%q): %v is not a 400", s, err)
		}
		if mode, d, err := parseExtend(&s); err == nil {
			if n := utf8.RuneCountInString(s); n > maxExtendChars {
				t.Fatalf("parseExtend took %q, %d characters; the spec allows %d", s, n, maxExtendChars)
			}
			switch mode {
			case broker.Settle, broker.Renew:
				if s != "true" && s != "false" || d != 0 {
					t.Fatalf("parseExtend(%q) = %v %v", s, mode, d)
				}
			case broker.ExtendBy:
				if d < 0 || d > broker.MaxVisibility {
					t.Fatalf("parseExtend(%q) = %v, outside [0, %v]", s, d, broker.MaxVisibility)
				}
				if n, err := strconv.ParseInt(s, 10, 64); err == nil && d != time.Duration(n)*time.Millisecond {
					t.Fatalf("parseExtend(%q) = %v, want %d ms", s, d, n)
				}
			default:
				t.Fatalf("parseExtend(%q): unknown mode %v", s, mode)
			}
		} else if toAPIError(err).status != 400 {
			t.Fatalf("parseExtend(%q): %v is not a 400", s, err)
		}
		if b64, err := forceBase64(&s); err == nil && (s != "base64" && s != "auto" || b64 != (s == "base64")) {
			t.Fatalf("forceBase64(%q) = %v", s, b64)
		}
		if ms, err := parseTime(s); err == nil {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil && ms != n {
				t.Fatalf("parseTime(%q) = %d", s, ms)
			}
		}
	})
}
