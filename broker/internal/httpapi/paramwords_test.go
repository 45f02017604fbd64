package httpapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// TestParameterErrorsSayWhatToSend: a parameter the generated router could not bind
// was refused in the binder's words ("Query argument receipt_handle is required, but
// not found", "error binding string parameter: strconv.ParseInt: parsing \"abc\":
// invalid syntax"), which say how Go failed, not what to send. Each now names the
// parameter and what it takes.
func TestParameterErrorsSayWhatToSend(t *testing.T) {
	t.Parallel()
	h := wordsServer(t)
	for _, c := range []struct{ method, target, want string }{
		{http.MethodPost, "/v1/topics/t/ack", "the query parameter receipt_handle is required: add ?receipt_handle=… to the URL"},
		{http.MethodPost, "/v1/topics/t/ack?receipt_handle=", "the query parameter receipt_handle must not be empty"},
		{http.MethodPost, "/v1/topics/t/produce?partition=abc", `the parameter partition must be a whole number, not \"abc\"`},
		{http.MethodPost, "/v1/topics/t/produce?partition=1&partition=0", "the parameter partition was given more than once; give it once"},
		{http.MethodGet, "/v1/topics/t/partitions/zz/messages", `the parameter partition must be a whole number, not \"zz\"`},
		{http.MethodGet, "/v1/topics/t/partitions/99999999999/messages", "the parameter partition is out of range"},
		{http.MethodGet, "/v1/topics/t/consume-batch?max=ten", `the parameter max must be a whole number, not \"ten\"`},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(c.method, c.target, strings.NewReader("x")))
		body := rec.Body.String()
		if rec.Code != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_parameter"`) || !strings.Contains(body, c.want) {
			t.Errorf("%s %s: %d %s; want 400 invalid_parameter saying %q", c.method, c.target, rec.Code, body, c.want)
		}
		for _, inside := range []string{"strconv", "binding", "Query argument", "but not found", "Invalid format"} {
			if strings.Contains(body, inside) {
				t.Errorf("%s %s: the answer shows the binder's words %q: %s", c.method, c.target, inside, body)
			}
		}
	}
}

// TestBodyErrorsSayWhatToSend: a batch body the decoder refused was answered in its
// words, which named Go types ("json: cannot unmarshal JSON string into Go
// apigen.OutgoingMessage: unknown object member name …"), and an empty body of a
// topic create said "can't decode JSON body: EOF". Each now names the member, as a
// JSON pointer, and what it takes.
func TestBodyErrorsSayWhatToSend(t *testing.T) {
	t.Parallel()
	h := wordsServer(t)
	for _, c := range []struct{ target, body, want string }{
		{"/v1/topics/t/produce-batch", `{"messages":[{"value":"x"}]}`, `/messages/0 has no member \"value\"; openapi.yaml lists the members it takes`},
		{"/v1/topics/t/produce-batch", `{"messages":[{"payload":"x","partition":"1"}]}`, "/messages/0/partition must be a whole number, not a string"},
		{"/v1/topics/t/produce-batch", `{"messages":{}}`, "/messages must be an array, not an object"},
		{"/v1/topics/t/produce-batch", `{"messages":[{"payload":"x","partition":1.5}]}`, "/messages/0/partition must be a whole number, not 1.5"},
		{"/v1/topics/t/produce-batch", `{"messages":[1]}`, "/messages/0 must be an object, not a number"},
		{"/v1/topics/t/produce-batch", `"x"`, "the body must be an object, not a string"},
		{"/v1/topics/t/produce-batch", `{"messages":[{"payload":"x","partition":99999999999}]}`, "/messages/0/partition is out of range"},
		{"/v1/topics/t/produce-batch", `{"messages":[{"payload":"x"`, "the body is not valid JSON: unexpected EOF"},
		{"/v1/topics/t/produce-batch", ``, "the body is empty; this operation takes a JSON object"},
		{"/v1/topics/t/produce-batch", `{"a~b/c":1}`, `the body has no member \"a~b/c\"`},
		{"/v1/topics/t/ack-batch", `{"acks":[{"handle":"x"}]}`, `/acks/0 has no member \"handle\"`},
		{"/v1/topics/t/ack-batch", `{"acks":[{"receipt_handle":1}]}`, "/acks/0/receipt_handle must be a string, not a number"},
		{"/v1/topics", ``, "the body is empty; this operation takes a JSON object"},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, c.target, strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
		body := rec.Body.String()
		if rec.Code != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_json"`) || !strings.Contains(body, c.want) {
			t.Errorf("POST %s %s: %d %s; want 400 invalid_json saying %q", c.target, c.body, rec.Code, body, c.want)
		}
		for _, inside := range []string{"Go ", "apigen", "unmarshal", "jsontext", "decode JSON body"} {
			if strings.Contains(body, inside) {
				t.Errorf("POST %s %s: the answer shows the decoder's words %q: %s", c.target, c.body, inside, body)
			}
		}
	}
	// As a server gets a body of no bytes (Content-Length: 0): http.NoBody.
	for _, target := range []string{"/v1/topics", "/v1/topics/t/produce-batch", "/v1/topics/t/ack-batch"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, target, nil)
		req.Body = http.NoBody
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "the body is empty; this operation takes a JSON object") {
			t.Errorf("POST %s with no body: %d %s; want 400 saying the body is empty", target, rec.Code, rec.Body)
		}
	}
}

// TestANotFoundKeepsItsDetail: a not-found that says which topic and why (the child
// of an attach, a topic deleted while a request waited) was answered with the plain
// "no such topic", which named none. Its detail is the message now; the plain error
// keeps the plain words.
func TestANotFoundKeepsItsDetail(t *testing.T) {
	t.Parallel()
	detailed := toAPIError(fmt.Errorf("%w: no topic %q to attach as a child; create it with POST /v1/topics, then attach it", broker.ErrTopicNotFound, "c"))
	if detailed.status != http.StatusNotFound || detailed.code != apigen.ErrorCodeTopicNotFound || detailed.msg != `no topic "c" to attach as a child; create it with POST /v1/topics, then attach it` {
		t.Errorf("detailed not-found: %d %s %q", detailed.status, detailed.code, detailed.msg)
	}
	plain := toAPIError(broker.ErrTopicNotFound)
	if plain.status != http.StatusNotFound || plain.code != apigen.ErrorCodeTopicNotFound || plain.msg != "no such topic; create it with POST /v1/topics" {
		t.Errorf("plain not-found: %d %s %q", plain.status, plain.code, plain.msg)
	}
}

// TestAnUnsupportedMemberSaysWhatToDo: "property \"partitions\" is unsupported" in an
// alter said what was refused, not that the count is fixed at create, nor where the
// members are listed.
func TestAnUnsupportedMemberSaysWhatToDo(t *testing.T) {
	t.Parallel()
	h := wordsServer(t)
	for _, c := range []struct{ method, target, body, want string }{
		{http.MethodPatch, "/v1/topics/t", `{"partitions":3}`, `property \"partitions\" is unsupported: a topic's partition count is fixed when it is created`},
		{http.MethodPatch, "/v1/topics/t", `{"name":"u"}`, `property \"name\" is unsupported: a topic is not renamed`},
		{http.MethodPatch, "/v1/topics/t", `{"retention":5}`, `property \"retention\" is unsupported; openapi.yaml lists the members this operation takes`},
		{http.MethodPost, "/v1/topics/t/children", `{"topic":"c"}`, `property \"topic\" is unsupported; openapi.yaml lists the members this operation takes`},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(c.method, c.target, strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), c.want) {
			t.Errorf("%s %s %s: %d %s; want 400 saying %q", c.method, c.target, c.body, rec.Code, rec.Body, c.want)
		}
	}
}

// wordsServer is a server over a broker that answers from its arguments: the refusals
// these tests read are made before the broker is asked.
func wordsServer(t *testing.T) http.Handler {
	t.Helper()
	h, err := New(&recordingBroker{}, Options{Logger: quietLogger(), AllowedHosts: []string{"example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	return h
}
