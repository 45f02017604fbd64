package httpapi

import (
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/jsondepth"
)

// payloadKind decides how a produced body is stored from its Content-Type, checking that
// it is what it claims to be.
func payloadKind(contentType string, body []byte) (uint16, error) {
	mt := ""
	if contentType != "" {
		var err error
		mt, _, err = mime.ParseMediaType(contentType)
		if err != nil {
			return 0, newErr(http.StatusBadRequest, apigen.ErrorCodeBadRequest, "the Content-Type header is malformed: "+err.Error())
		}
	}
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		// JSON is UTF-8 (RFC 8259 §8.1); json.Valid alone lets invalid bytes inside
		// strings through, and serving them back verbatim would break every response
		// they are part of.
		if !json.Valid(body) || !utf8.Valid(body) {
			return 0, newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidPayload, "the body is not valid JSON but Content-Type says it is; fix the JSON or send application/octet-stream")
		}
		if jsondepth.Exceeds(body, MaxPayloadDepth) {
			return 0, tooDeep("")
		}
		return kindJSON, nil
	case strings.HasPrefix(mt, "text/"):
		if !utf8.Valid(body) {
			return 0, newErr(http.StatusBadRequest, apigen.ErrorCodeInvalidPayload, "the body is not valid UTF-8 but Content-Type says text; send application/octet-stream for bytes")
		}
		return kindText, nil
	case mt == "application/octet-stream":
		return kindBinary, nil
	}
	// No or another content type (curl -d sends a form type): sniff.
	switch {
	case len(body) > 0 && json.Valid(body) && utf8.Valid(body):
		if jsondepth.Exceeds(body, MaxPayloadDepth) {
			return 0, tooDeep("")
		}
		return kindJSON, nil
	case utf8.Valid(body):
		return kindText, nil
	}
	return kindBinary, nil
}

func checkKey(key *string) ([]byte, error) {
	if key == nil {
		return nil, nil
	}
	if len(*key) > broker.MaxKeyBytes {
		return nil, badParam("key is " + strconv.Itoa(len(*key)) + " bytes; the limit is " + strconv.Itoa(broker.MaxKeyBytes))
	}
	if !utf8.ValidString(*key) {
		return nil, badParam("key is not valid UTF-8")
	}
	return []byte(*key), nil
}

func checkPartition(p *int32) (int32, error) {
	if p == nil {
		return -1, nil
	}
	if *p < 0 {
		return 0, badParam("partition must be 0 or more")
	}
	return *p, nil
}

// parseWait reads a wait parameter: a Go duration ("10s", "500ms") or whole seconds.
func parseWait(s *string) (time.Duration, error) {
	if s == nil || *s == "" {
		return 0, nil
	}
	d, err := parseDuration(*s, time.Second)
	if err != nil || d < 0 {
		return 0, badParam("wait must be a duration like 10s or 500ms, or whole seconds, from 0 to " + broker.ShortDuration(broker.MaxWait))
	}
	if d > broker.MaxWait {
		return 0, badParam("wait is capped at " + broker.ShortDuration(broker.MaxWait) + "; poll again after it answers")
	}
	return d, nil
}

// parseDuration accepts a Go duration or a bare integer in unit.
func parseDuration(s string, unit time.Duration) (time.Duration, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n > int64(time.Duration(1<<62)/unit) || n < -int64(time.Duration(1<<62)/unit) {
			return 0, errors.New("out of range")
		}
		return time.Duration(n) * unit, nil
	}
	return time.ParseDuration(s)
}

// forceBase64 reads a payload_encoding parameter (each operation has its own generated
// string type for it).
func forceBase64[T ~string](p *T) (bool, error) {
	if p == nil {
		return false, nil
	}
	switch string(*p) {
	case "base64":
		return true, nil
	case "auto":
		return false, nil
	}
	return false, badParam("payload_encoding must be base64 or auto")
}

// maxExtendChars is the spec's maxLength of extend, as a parameter and in ack-batch.
const maxExtendChars = 32

// parseExtend reads an ack's extend parameter.
func parseExtend(s *string) (broker.AckMode, time.Duration, error) {
	if s == nil {
		return broker.Settle, 0, nil
	}
	if utf8.RuneCountInString(*s) > maxExtendChars {
		return 0, 0, badParam("extend is at most " + strconv.Itoa(maxExtendChars) + " characters: true, 0 or a duration like 45s")
	}
	switch *s {
	case "true":
		return broker.Renew, 0, nil
	case "false":
		return broker.Settle, 0, nil
	}
	d, err := parseDuration(*s, time.Millisecond)
	if err != nil || d < 0 {
		return 0, 0, badParam("extend must be true, 0 (hand back now) or a duration like 45s, 500ms or milliseconds")
	}
	if d > broker.MaxVisibility {
		return 0, 0, badParam("extend is capped at " + broker.ShortDuration(broker.MaxVisibility))
	}
	return broker.ExtendBy, d, nil
}

// parseTime reads RFC 3339 or Unix milliseconds.
func parseTime(s string) (int64, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, err
	}
	return t.UnixMilli(), nil
}
