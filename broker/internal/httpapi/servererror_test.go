package httpapi

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestServerErrorJSON(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in     string
		status int
		want   string // in the message
	}{
		{"HTTP/1.1 431 Request Header Fields Too Large" + netHTTPErrorHeaders + "431 Request Header Fields Too Large", 431, "64 KiB"},
		{"HTTP/1.1 400 Bad Request" + netHTTPErrorHeaders + "400 Bad Request", 400, "not valid HTTP:"},
		{"HTTP/1.1 400 Bad Request: missing required Host header" + netHTTPErrorHeaders + "400 Bad Request: missing required Host header", 400, "(missing required Host header)"},
		{"HTTP/1.1 501 Not Implemented" + netHTTPErrorHeaders + "Unsupported transfer encoding", 501, "Transfer-Encoding"},
		{netHTTPNotTLS, 400, "https://"},
	} {
		out, ok := serverErrorJSON([]byte(c.in))
		if !ok {
			t.Errorf("%.40q: not recognised", c.in)
			continue
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
		if err != nil {
			t.Fatalf("%.40q: the rewrite is not a response: %v\n%s", c.in, err, out)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != c.status || resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(string(body), c.want) || !resp.Close {
			t.Errorf("%.40q: got %d %q %s (close %v), want %d, JSON, %q", c.in, resp.StatusCode, resp.Header.Get("Content-Type"), body, resp.Close, c.status, c.want)
		}
	}
	// The broker's own answers pass untouched, as do partial writes and non-HTTP bytes.
	for _, in := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nDate: x\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\n",
		"\x17\x03\x03\x00\x10HTTP/1.1 400",
		"HTTP/1.1 4",
	} {
		if _, ok := serverErrorJSON([]byte(in)); ok {
			t.Errorf("%.50q was rewritten", in)
		}
	}
}
