package httpapi

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/broker"
)

func TestParseExtend(t *testing.T) {
	t.Parallel()
	str := func(s string) *string { return &s }
	cases := []struct {
		in   *string
		mode broker.AckMode
		d    time.Duration
		bad  bool
	}{
		{nil, broker.Settle, 0, false},
		{str("true"), broker.Renew, 0, false},
		{str("false"), broker.Settle, 0, false},
		{str("0"), broker.ExtendBy, 0, false},
		{str("45s"), broker.ExtendBy, 45 * time.Second, false},
		{str("500ms"), broker.ExtendBy, 500 * time.Millisecond, false},
		{str("1500"), broker.ExtendBy, 1500 * time.Millisecond, false},
		{str("12h"), broker.ExtendBy, 12 * time.Hour, false},
		{str("12h1s"), 0, 0, true},
		{str("-5"), 0, 0, true},
		{str("-1s"), 0, 0, true},
		{str("abc"), 0, 0, true},
		{str(""), 0, 0, true},
		{str("9223372036854775807"), 0, 0, true},
	}
	for _, c := range cases {
		mode, d, err := parseExtend(c.in)
		if (err != nil) != c.bad || (!c.bad && (mode != c.mode || d != c.d)) {
			name := "<nil>"
			if c.in != nil {
				name = *c.in
			}
			t.Errorf("parseExtend(%q) = %v %v %v", name, mode, d, err)
		}
	}
}

func TestParseWait(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"": 0, "0": 0, "10": 10 * time.Second, "10s": 10 * time.Second, "500ms": 500 * time.Millisecond, "20s": 20 * time.Second} {
		if got, err := parseWait(&in); err != nil || got != want {
			t.Errorf("parseWait(%q) = %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"21s", "21", "-1", "-1s", "abc", "1e3", "99999999999999999999"} {
		if _, err := parseWait(&in); err == nil {
			t.Errorf("parseWait(%q) accepted", in)
		}
	}
}

func TestPayloadKind(t *testing.T) {
	t.Parallel()
	cases := []struct {
		ct   string
		body string
		kind uint16
		bad  bool
	}{
		{"application/json", `{"a":1}`, kindJSON, false},
		{"application/json; charset=utf-8", `[1]`, kindJSON, false},
		{"application/cloudevents+json", `{}`, kindJSON, false},
		{"application/json", `{"a":`, 0, true},
		{"application/json", "{\"a\":\"\xff\"}", 0, true},
		{"", "{\"a\":\"\xff\"}", kindBinary, false},
		{"text/plain", "héllo", kindText, false},
		{"text/plain", "\xff", 0, true},
		{"application/octet-stream", `{"a":1}`, kindBinary, false},
		{"", `{"a":1}`, kindJSON, false},
		{"application/x-www-form-urlencoded", `hello`, kindText, false},
		{"", "", kindText, false},
		{"", "\x00\xff", kindBinary, false},
		{"text/plain; charset", "x", 0, true},
	}
	for _, c := range cases {
		kind, err := payloadKind(c.ct, []byte(c.body))
		if (err != nil) != c.bad || (!c.bad && kind != c.kind) {
			t.Errorf("payloadKind(%q, %q) = %d %v", c.ct, c.body, kind, err)
		}
	}
}

func TestCheckJSONShape(t *testing.T) {
	t.Parallel()
	good := []string{`{}`, `{"a":{"a":1},"b":[{"a":1},{"a":2}]}`, `[]`, `{"a":[1,2,{"b":"a"}],"c":"a"}`}
	for _, g := range good {
		if err := checkJSONShape([]byte(g)); err != nil {
			t.Errorf("%s: %v", g, err)
		}
	}
	deep := ""
	for i := 0; i < 65; i++ {
		deep += "["
	}
	bad := []string{`{"a":1,"a":2}`, `{"x":{"b":1,"b":1}}`, `{`, `{} {}`, deep, `{"a":1}x`}
	for _, b := range bad {
		if err := checkJSONShape([]byte(b)); err == nil {
			t.Errorf("%.40s: accepted", b)
		}
	}
}

// FuzzCheckJSONShape checks the shape check never panics and never accepts what
// encoding/json rejects.
func FuzzCheckJSONShape(f *testing.F) {
	f.Add([]byte(`{"a":[1,{"b":2}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if checkJSONShape(b) == nil && !json.Valid(b) {
			t.Fatalf("accepted invalid JSON %q", b)
		}
	})
}
