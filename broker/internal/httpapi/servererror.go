package httpapi

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/jsonstr"
)

// net/http answers a few malformed requests itself, before any handler runs, with a
// plain-text body and no hook to change it: headers over MaxHeaderBytes (431), an
// unknown Transfer-Encoding (501), a request it cannot parse (400: a repeated
// Content-Length, a malformed header line, no Host), an unsupported HTTP version (505),
// and a plain-HTTP request to the TLS port (400). Each is one Write of a fixed shape
// on the connection, straight after which the server hangs up. serverErrorJSON
// recognises those writes on the raw connection and gives them the API's JSON error
// body, so every client parses every error the same way.
//
// What it cannot reach: on a TLS port the first four are written inside TLS, above
// the raw connection, and stay plain text; the answers of the HTTP/2 server are
// frames (RST_STREAM, GOAWAY), not bodies.

// netHTTPErrorHeaders is what net/http puts between its status line and its text.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// netHTTPNotTLS is net/http's whole answer to plain HTTP on a TLS port.
const netHTTPNotTLS = "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"

// serverErrorJSON returns the JSON form of p if p is one of net/http's own plain-text
// error answers.
func serverErrorJSON(p []byte) ([]byte, bool) {
	if len(p) < 12 || p[0] != 'H' || !bytes.HasPrefix(p, []byte("HTTP/1.")) {
		return nil, false
	}
	if string(p) == netHTTPNotTLS {
		return jsonErrorResponse("HTTP/1.0", http.StatusBadRequest, apigen.ErrorCodeBadRequest,
			"this port speaks HTTPS: use an https:// URL"), true
	}
	eol := bytes.Index(p, []byte("\r\n"))
	if eol < 0 || !bytes.HasPrefix(p[eol:], []byte(netHTTPErrorHeaders)) {
		return nil, false
	}
	status, err := strconv.Atoi(string(p[9:12]))
	if err != nil || status < 400 || status > 599 {
		return nil, false
	}
	text := string(p[eol+len(netHTTPErrorHeaders):])
	var code apigen.ErrorCode
	var msg string
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		code, msg = apigen.ErrorCodeBadRequest, "the request's headers are over the broker's limit of "+strconv.Itoa(MaxHeaderBytes>>10)+" KiB; send fewer or shorter headers (data belongs in the body)"
	case http.StatusNotImplemented:
		code, msg = apigen.ErrorCodeBadRequest, "the request's Transfer-Encoding is not supported; send the body with a Content-Length or Transfer-Encoding: chunked"
	case http.StatusHTTPVersionNotSupported:
		code, msg = apigen.ErrorCodeBadRequest, "the request's HTTP version is not supported; use HTTP/1.1 or HTTP/2"
	default:
		// The text repeats the status line, then may say why ("missing required Host
		// header").
		why := strings.TrimPrefix(strings.TrimPrefix(text, strconv.Itoa(status)+" "+http.StatusText(status)), ": ")
		if why != "" {
			why = " (" + clip(why, maxEcho) + ")"
		}
		code, msg = apigen.ErrorCodeBadRequest, "the request is not valid HTTP"+why+": for example a repeated or malformed Content-Length, a malformed header line or no Host header; fix the client"
	}
	return jsonErrorResponse("HTTP/1.1", status, code, msg), true
}

// jsonErrorResponse is a whole HTTP/1 response carrying the JSON error body, after which
// the connection closes.
func jsonErrorResponse(proto string, status int, code apigen.ErrorCode, msg string) []byte {
	body := make([]byte, 0, 64+len(msg))
	body = append(body, `{"error":{"code":`...)
	body = jsonstr.Append(body, string(code))
	body = append(body, `,"message":`...)
	body = jsonstr.Append(body, msg)
	body = append(body, "}}\n"...)
	out := make([]byte, 0, 128+len(body))
	out = append(out, proto...)
	out = append(out, ' ')
	out = strconv.AppendInt(out, int64(status), 10)
	out = append(out, ' ')
	out = append(out, http.StatusText(status)...)
	out = append(out, "\r\nContent-Type: application/json\r\nContent-Length: "...)
	out = strconv.AppendInt(out, int64(len(body)), 10)
	out = append(out, "\r\nConnection: close\r\n\r\n"...)
	return append(out, body...)
}
