package cli

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	narad "github.com/narad-mq/narad/sdk-go"
)

// writeJSON writes v as indented JSON and a newline: one document per command, for
// scripts (jq) to read.
func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// messageJSON is how a message is written with --output json: one object per line
// (JSON Lines), so a stream can be read as it comes. The payload is a string when it is
// valid UTF-8 text, else payload_base64 holds its bytes.
type messageJSON struct {
	Topic           string  `json:"topic"`
	Partition       int32   `json:"partition"`
	Offset          int64   `json:"offset"`
	Key             *string `json:"key"`
	Timestamp       string  `json:"timestamp"`
	DeliveryAttempt int     `json:"delivery_attempt,omitempty"`
	Payload         *string `json:"payload,omitempty"`
	PayloadBase64   *string `json:"payload_base64,omitempty"`
}

func toMessageJSON(m *narad.Message) messageJSON {
	out := messageJSON{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
		Timestamp: m.Timestamp.UTC().Format(time.RFC3339Nano), DeliveryAttempt: m.DeliveryAttempt}
	if m.Key != "" {
		k := m.Key
		out.Key = &k
	}
	b := m.Bytes()
	if utf8.Valid(b) {
		s := string(b)
		out.Payload = &s
	} else {
		s := base64.StdEncoding.EncodeToString(b)
		out.PayloadBase64 = &s
	}
	return out
}

// printable reports whether b is text that is safe to show on a terminal: valid UTF-8
// without control characters other than tab and newline (no escape sequences).
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\t' && r != '\n' && r != '\r' {
			return false
		}
	}
	return true
}

// messageWriter prints messages in the chosen format.
type messageWriter struct {
	e      *env
	format string
}

// errBinaryToTerminal is returned for a binary payload that raw output would have
// dumped on a terminal.
var errBinaryToTerminal = fmt.Errorf("a binary payload is not written raw to a terminal: pipe the output, or use --output json (base64) or table")

// write prints m. It fails with errBinaryToTerminal, having printed nothing, when raw
// output would put binary bytes on a terminal.
func (w *messageWriter) write(m *narad.Message) error {
	b := m.Bytes()
	switch w.format {
	case "json":
		line, err := json.Marshal(toMessageJSON(m))
		if err != nil {
			return err
		}
		_, err = w.e.Stdout.Write(append(line, '\n'))
		return err
	case "raw":
		return w.writeBytes(b)
	}
	payload := string(b)
	if !printable(b) {
		payload = "<" + strconv.Itoa(len(b)) + " bytes, binary: use --output json or raw>"
	}
	key := m.Key
	switch {
	case key == "":
		key = "-"
	case !printable([]byte(key)) || strings.ContainsAny(key, "\t\n\r"):
		// A key is any string: escape sequences in it would reach the terminal, and a
		// tab or a newline would shift the columns. Shown quoted, as Go would.
		key = strconv.Quote(key)
	}
	_, err := fmt.Fprintf(w.e.Stdout, "%d\t%d\t%s\t%s\n", m.Partition, m.Offset, key, payload)
	return err
}

// human formats a duration for tables: "12h0m0s" reads better as "12h".
func human(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	s := d.String()
	for _, suffix := range []string{"m0s", "h0m"} {
		if len(s) > len(suffix) && s[len(s)-len(suffix):] == suffix {
			s = s[:len(s)-len(suffix)+1]
		}
	}
	return s
}

// writeBytes writes a raw payload and a newline, unless it is binary and Stdout a terminal.
func (w *messageWriter) writeBytes(b []byte) error {
	if w.e.StdoutIsTerminal && !printable(b) {
		return errBinaryToTerminal
	}
	_, err := w.e.Stdout.Write(append(append([]byte(nil), b...), '\n'))
	return err
}
