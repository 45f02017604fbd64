// Package auth holds users, grants and the pure rules that decide who may do what. It
// does no I/O: the control plane stores users, the HTTP layer asks these functions.
package auth

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/crypto/bcrypt"
)

// Action is what a grant allows.
type Action string

// The actions. Consume also covers ack, extend, nack and replay; admin covers every
// action on its topics, and with the pattern "*" also users and the cluster.
const (
	Produce Action = "produce"
	Consume Action = "consume"
	Create  Action = "create"
	Admin   Action = "admin"
)

// Grant allows an action on the topics its patterns match.
type Grant struct {
	Action Action   `json:"action"`
	Topics []string `json:"topics"`
}

// User is a stored user. Hash is the bcrypt hash of the password; it never leaves the
// broker. ID is given by the control plane when the user is created and never reused,
// so what refers to a user by ID (a topic's owner) does not pass to a later user who
// takes a deleted user's name.
type User struct {
	ID     uint64  `json:"id,omitempty"`
	Name   string  `json:"name"`
	Hash   []byte  `json:"hash"`
	Grants []Grant `json:"grants"`
}

// Password limits: bcrypt reads at most 72 bytes, so longer passwords are refused rather
// than silently truncated.
const (
	MinPasswordBytes = 8
	MaxPasswordBytes = 72
	MaxUsernameLen   = 128
	// BcryptCost is the work factor of stored hashes.
	BcryptCost = 10
)

// ErrInvalid means a username, password or grant breaks the rules; the message says which.
var ErrInvalid = errors.New("auth: invalid")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// CheckUsername checks a username: 1 to 128 characters of a-z A-Z 0-9 . _ - @.
func CheckUsername(name string) error {
	if name == "" || len(name) > MaxUsernameLen {
		return invalid("a username is 1 to %d characters", MaxUsernameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '@') {
			return invalid("a username uses only a-z A-Z 0-9 . _ - @")
		}
	}
	return nil
}

// CheckPassword checks a new password: 8 to 72 bytes of valid UTF-8 without U+FFFD. A
// JSON decoder puts U+FFFD in place of bytes that are not UTF-8, so a password that
// arrives holding it may not be the one the client meant, and could never be typed
// back at login: it is refused rather than stored.
func CheckPassword(pw string) error {
	if len(pw) < MinPasswordBytes || len(pw) > MaxPasswordBytes {
		return invalid("a password is %d to %d bytes (bcrypt reads no more than 72)", MinPasswordBytes, MaxPasswordBytes)
	}
	if !utf8.ValidString(pw) || strings.ContainsRune(pw, utf8.RuneError) {
		return invalid("a password must be valid UTF-8 and may not hold U+FFFD (sent in JSON, bytes that are not UTF-8 turn into it); send the password as UTF-8")
	}
	return nil
}

// HashPassword returns the bcrypt hash of pw.
func HashPassword(pw string) ([]byte, error) {
	return bcrypt.GenerateFromPassword([]byte(pw), BcryptCost)
}

// CheckPattern checks a grant's topic pattern: "*" (every topic), an exact topic name,
// or a prefix wildcard "P.*" matching every name that starts with "P.".
func CheckPattern(p string, validName func(string) bool) error {
	if p == "*" {
		return nil
	}
	if prefix, ok := strings.CutSuffix(p, ".*"); ok {
		if prefix == "" || !validName(prefix) || strings.Contains(prefix, "*") {
			return invalid("pattern %q: a wildcard is a topic-name prefix followed by .*", p)
		}
		return nil
	}
	if !validName(p) {
		return invalid("pattern %q is neither a topic name, a prefix.* wildcard, nor *", p)
	}
	return nil
}

// CheckGrants checks every grant's action and patterns.
func CheckGrants(gs []Grant, validName func(string) bool) error {
	for _, g := range gs {
		switch g.Action {
		case Produce, Consume, Create, Admin:
		default:
			return invalid("action %q is not one of produce, consume, create, admin", g.Action)
		}
		if len(g.Topics) == 0 {
			return invalid("a %s grant names at least one topic pattern", g.Action)
		}
		for _, p := range g.Topics {
			if err := CheckPattern(p, validName); err != nil {
				return err
			}
		}
	}
	return nil
}

// Match reports whether pattern matches the topic name.
func Match(pattern, topic string) bool {
	if pattern == "*" {
		return true
	}
	if prefix, ok := strings.CutSuffix(pattern, ".*"); ok {
		return len(topic) > len(prefix)+1 && strings.HasPrefix(topic, prefix+".")
	}
	return pattern == topic
}

// covers reports whether every topic pattern q matches is also matched by p.
func covers(p, q string) bool {
	if p == "*" {
		return true
	}
	if q == "*" {
		return false
	}
	pp, pWild := strings.CutSuffix(p, ".*")
	qp, qWild := strings.CutSuffix(q, ".*")
	switch {
	case !pWild:
		return !qWild && p == q
	case !qWild:
		return Match(p, q)
	default:
		// q.* ⊆ p.* when every "q." name is a "p." name.
		return strings.HasPrefix(qp+".", pp+".")
	}
}

// Can reports whether u may do action on topic: a grant of that action, or admin,
// matching the topic.
func (u *User) Can(action Action, topic string) bool {
	for _, g := range u.Grants {
		if g.Action != action && g.Action != Admin {
			continue
		}
		for _, p := range g.Topics {
			if Match(p, topic) {
				return true
			}
		}
	}
	return false
}

// IsAdmin reports whether u administers everything (an admin grant on "*"): users, the
// cluster and every topic.
func (u *User) IsAdmin() bool {
	for _, g := range u.Grants {
		if g.Action == Admin {
			for _, p := range g.Topics {
				if p == "*" {
					return true
				}
			}
		}
	}
	return false
}

// CanSee reports whether u holds any grant on topic (to list or inspect it).
func (u *User) CanSee(topic string) bool {
	for _, g := range u.Grants {
		for _, p := range g.Topics {
			if Match(p, topic) {
				return true
			}
		}
	}
	return false
}

// Covers reports whether u holds everything gs grants, so u may hand gs to someone
// else: nobody grants more than they hold.
func (u *User) Covers(gs []Grant) bool {
	for _, g := range gs {
		for _, q := range g.Topics {
			ok := false
			for _, h := range u.Grants {
				if h.Action != g.Action && h.Action != Admin {
					continue
				}
				for _, p := range h.Topics {
					if covers(p, q) {
						ok = true
						break
					}
				}
				if ok {
					break
				}
			}
			if !ok {
				return false
			}
		}
	}
	return true
}
