package workload

import (
	"encoding/base64"
	"encoding/json"
	"testing"
)

// TestPayloadIDReadsBothEncodings: a message produced as JSON is delivered verbatim, one
// produced as bytes (a batch with an odd pad) as base64 with payload_encoding base64;
// both carry their id, and a payload with none is marked unexpected.
func TestPayloadIDReadsBothEncodings(t *testing.T) {
	doc, _ := json.Marshal(payload{ID: "e-17", Pad: "xxx"})
	b64, _ := json.Marshal(base64.StdEncoding.EncodeToString(doc))
	for _, c := range []struct {
		raw, enc, want string
	}{
		{string(doc), "", "e-17"},
		{string(b64), "base64", "e-17"},
		{string(b64), "", "?" + string(b64)},
		{`"not base64!"`, "base64", `?"not base64!"`},
		{`{"pad":"x"}`, "", `?{"pad":"x"}`},
	} {
		if got := payloadID(json.RawMessage(c.raw), c.enc); got != c.want {
			t.Errorf("payloadID(%s, %q) = %q; want %q", c.raw, c.enc, got, c.want)
		}
	}
}
