package httpapi

import (
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/meta"
)

type authRecBroker struct {
	recordingBroker
	users *fakeUsers
}

func (a *authRecBroker) User(name string) (auth.User, bool) { return a.users.get(name) }
func (a *authRecBroker) TopicMeta(name string) (meta.Topic, error) {
	return meta.Topic{}, broker.ErrTopicNotFound
}

// TestDirectRoutesRandomizedAgainstGenerated sends 1,500 random requests of the
// direct routes' shapes (escaped and odd topics, repeated, empty, bare and unknown
// query names, other methods, bodies and content types), with security off and on, to
// a server and to one without direct routes, and compares status, headers, body and the
// broker calls; it fails when too few were served directly to prove anything. (A review
// ran it with 20,000 each: no difference. Kept small: make test runs it under -race.)
func TestDirectRoutesRandomizedAgainstGenerated(t *testing.T) {
	t.Parallel()
	topics := []string{"t", "missing", "a%20b", "%74", "a%2Fb", "a%25b", "a%2525b", "%C3%A9", "é", "a+b", "a;b", "a,b", "u", "t.x", "a%2C", "", ".", "..", "%2E", "t%00", "t$", "a:b", "a@b", "a!b", "t'", "a(b)", "a*b", "x%7E"}
	ops := []struct{ m, op string }{{"POST", "produce"}, {"GET", "consume"}, {"POST", "ack"}, {"HEAD", "consume"}, {"PUT", "produce"}, {"GET", "produce"}, {"POST", "consume"}, {"OPTIONS", "ack"}}
	names := []string{"key", "partition", "wait", "offset", "payload_encoding", "receipt_handle", "extend", "bogus", "", "key[x]", "partition.x", "Key", "wait%00", "receipt%5Fhandle", "max"}
	vals := []string{"", "1", "-1", "x", "a,b", "%2C", "true", "250ms", "base64", "+", "1e3", "%201", "0", "3.1.2.7.99.1", "%00", "2147483648", "é", "%FF"}
	n := map[string]int{}
	for _, authOn := range []bool{false, true} {
		mk := func(direct bool) (http.Handler, *authRecBroker) {
			rb := &authRecBroker{users: newFakeUsers(t, "alice", "alice-password-1")}
			rb.users.users["alice"] = auth.User{Name: "alice", Hash: rb.users.users["alice"].Hash, Grants: []auth.Grant{{Action: auth.Produce, Topics: []string{"t", "a b", "é", "missing"}}, {Action: auth.Consume, Topics: []string{"t", "missing"}}}}
			h, err := New(rb, Options{Logger: quietLogger(), AllowedHosts: []string{"example.com"}, AuthEnabled: func() bool { return authOn }})
			if err != nil {
				t.Fatal(err)
			}
			if !direct {
				h.(*server).d.h = nil
			} else {
				h.(*server).directHook = func(op string) { n[op]++ }
			}
			return h, rb
		}
		dh, db := mk(true)
		gh, gb := mk(false)
		rng := rand.New(rand.NewSource(1))
		for i := 0; i < 1500; i++ {
			o := ops[rng.Intn(len(ops))]
			if rng.Intn(3) > 0 {
				o = ops[rng.Intn(3)]
			}
			target := "/v1/topics/" + topics[rng.Intn(len(topics))] + "/" + o.op
			var qs []string
			for n := rng.Intn(4); n > 0; n-- {
				p := names[rng.Intn(len(names))]
				if rng.Intn(10) == 0 {
					qs = append(qs, p)
				} else {
					qs = append(qs, p+"="+vals[rng.Intn(len(vals))])
				}
			}
			if o.op == "ack" && rng.Intn(2) == 0 {
				qs = append(qs, "receipt_handle="+vals[rng.Intn(len(vals))])
			}
			if len(qs) > 0 || rng.Intn(5) == 0 {
				target += "?" + strings.Join(qs, "&")
			}
			body := []string{"", "x", `{"a":1}`, "\xff"}[rng.Intn(4)]
			ctype := []string{"", "application/json", "text/plain", "application/octet-stream"}[rng.Intn(4)]
			user := []string{"", "alice:alice-password-1"}[rng.Intn(2)]
			db.calls, gb.calls = nil, nil
			answer := func(h http.Handler) *httptest.ResponseRecorder {
				req := httptest.NewRequest(o.m, target, strings.NewReader(body))
				if ctype != "" {
					req.Header.Set("Content-Type", ctype)
				}
				if user != "" {
					u, p, _ := strings.Cut(user, ":")
					req.SetBasicAuth(u, p)
				}
				req.Header.Set("X-Request-Id", "same-id")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				return rec
			}
			var got, want *httptest.ResponseRecorder
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Fatalf("%s %s: panic %v", o.m, target, v)
					}
				}()
				got = answer(dh)
				want = answer(gh)
			}()
			name := fmt.Sprintf("auth=%v %s %s %q %q %s", authOn, o.m, target, ctype, body, user)
			sameAnswer(t, name, got, want, db.calls, gb.calls)
		}
	}
	t.Logf("served directly: %v", n)
	if n["produce"] < 30 || n["consume"] < 30 || n["ack"] < 12 {
		t.Fatalf("served directly: %v; too few to prove the comparison", n)
	}
}
