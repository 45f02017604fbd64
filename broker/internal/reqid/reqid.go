// Package reqid carries a request's id in its context, so that every log line written
// about the request names it: the HTTP API puts the id in (and answers it in the
// X-Request-Id header), and Handler, wrapped around the node's slog handler, adds it to
// every record logged with that context (slog's *Context methods). A client that quotes
// the header of a failed answer lets an operator find every line about that request.
package reqid

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"math/rand/v2"
)

// Header is the HTTP header that carries the id, both ways.
const Header = "X-Request-Id"

// MaxLen is the longest id taken from a client; a longer one is replaced.
const MaxLen = 64

type key struct{}

// With returns ctx carrying id.
func With(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, key{}, id)
}

// From returns the id ctx carries, or "".
func From(ctx context.Context) string {
	if ctx == nil {
		return ""
	}
	id, _ := ctx.Value(key{}).(string)
	return id
}

// Sane reports whether a client's id may be kept: 1 to MaxLen characters of
// [A-Za-z0-9._-], so it can go into a log line and a header unquoted and unescaped.
func Sane(id string) bool {
	if id == "" || len(id) > MaxLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// New returns a fresh id: 16 random hex digits, unique enough to find one request
// in a node's logs. It runs on every request and needs no secrecy, so it draws from
// math/rand/v2's generator rather than the kernel's.
func New() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

// Handler adds the request id of a record's context, as request_id, to every record
// its inner handler writes.
type Handler struct{ inner slog.Handler }

// NewHandler wraps inner.
func NewHandler(inner slog.Handler) *Handler { return &Handler{inner: inner} }

// Enabled reports whether the inner handler takes records of level l.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

// Handle adds request_id when ctx carries one.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if id := From(ctx); id != "" {
		r = r.Clone()
		r.AddAttrs(slog.String("request_id", id))
	}
	return h.inner.Handle(ctx, r)
}

// WithAttrs keeps the wrapper around the inner handler's result.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{inner: h.inner.WithAttrs(as)}
}

// WithGroup keeps the wrapper around the inner handler's result.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{inner: h.inner.WithGroup(name)}
}
