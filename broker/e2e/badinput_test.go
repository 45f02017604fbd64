package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// state is what a refused request must not change: the topics, their incarnations
// and every partition's offsets, frontier and leases.
type state map[string][]partitionStats

func snapshot(a *api) state {
	a.t.Helper()
	s := state{}
	for _, name := range a.topicNames() {
		d := a.topic(name)
		s[name+"@"+d.Incarnation] = d.PartitionStats
	}
	return s
}

type badCase struct {
	name   string
	method string
	path   string
	body   []byte
	hdr    []string
	status int
	codes  []string // any of these error codes
}

// TestBadInput sends malformed requests to every route and checks each answer's status
// and error code, that its body is the JSON error shape, and that nothing changed.
func TestBadInput(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("t", map[string]any{"partitions": 2})
	a.createTopic("other", map[string]any{"partitions": 1})
	a.produceJSON("t", map[string]any{"id": "0"}, "partition=0")
	a.produceJSON("other", map[string]any{"id": "x"}, "")
	// Within the create-time budgets, but two alternatives a level recurse with the
	// payload's nesting: 2^depth steps (audit issue 16, finding 2).
	a.createTopic("bomb", map[string]any{"partitions": 1, "schema": json.RawMessage(`{"$defs":{"n":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/n"},"contains":false},{"type":"array","items":{"$ref":"#/$defs/n"}}]}},"$ref":"#/$defs/n"}`)})
	held := a.mustConsume("t", "5s")        // a lease that bad acks must not touch
	foreign := a.mustConsume("other", "5s") // a handle of another topic
	before := snapshot(a)

	js := []string{"Content-Type", "application/json"}
	name250 := strings.Repeat("a", 250)
	deep := strings.Repeat("[", 100) + strings.Repeat("]", 100)
	msgs := func(n int) []byte {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = `{"payload":` + fmt.Sprint(i) + `}`
		}
		return []byte(`{"messages":[` + strings.Join(parts, ",") + `]}`)
	}
	acks := func(n int) []byte {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = `{"receipt_handle":"` + held.ReceiptHandle + `","extend":"true"}`
		}
		return []byte(`{"acks":[` + strings.Join(parts, ",") + `]}`)
	}
	tampered := []byte(held.ReceiptHandle)
	tampered[len(tampered)/2] ^= 0x01 // still base64, checksum wrong
	if tampered[len(tampered)/2] == '-' || tampered[len(tampered)/2] == '_' {
		tampered[len(tampered)/2] = 'A'
	}
	bad := func(name, method, path, body string, status int, codes ...string) badCase {
		c := badCase{name: name, method: method, path: path, status: status, codes: codes}
		if body != "" {
			c.body, c.hdr = []byte(body), js
		}
		return c
	}
	const (
		s400 = http.StatusBadRequest
		s404 = http.StatusNotFound
		s413 = http.StatusRequestEntityTooLarge
	)
	const ij, ip, in = "invalid_json", "invalid_parameter", "invalid_name"
	cases := []badCase{
		// Create: JSON shape and types.
		bad("create bad json", "POST", "/v1/topics", `{"name":`, s400, ij),
		bad("create not an object", "POST", "/v1/topics", `["t2"]`, s400, ij),
		bad("create empty body", "POST", "/v1/topics", ` `, s400, ij),
		{name: "create no body", method: "POST", path: "/v1/topics", status: s400, codes: []string{ij, "bad_request"}},
		bad("create unknown field", "POST", "/v1/topics", `{"name":"t2","colour":"red"}`, s400, ij),
		bad("create name missing", "POST", "/v1/topics", `{"partitions":1}`, s400, ij),
		bad("create name a number", "POST", "/v1/topics", `{"name":5}`, s400, ij),
		bad("create partitions a string", "POST", "/v1/topics", `{"name":"t2","partitions":"3"}`, s400, ij),
		bad("create partitions a fraction", "POST", "/v1/topics", `{"name":"t2","partitions":1.5}`, s400, ij),
		bad("create retention a bool", "POST", "/v1/topics", `{"name":"t2","retention_ms":true}`, s400, ij),
		bad("create two values", "POST", "/v1/topics", `{"name":"t2"} {"name":"t3"}`, s400, ij),
		bad("create two values unspaced", "POST", "/v1/topics", `{"name":"t2"}{}`, s400, ij),
		bad("create trailing garbage", "POST", "/v1/topics", `{"name":"t2"} x`, s400, ij),
		bad("create duplicate key", "POST", "/v1/topics", `{"name":"t2","name":"t3"}`, s400, ij),
		bad("create duplicate nested key", "POST", "/v1/topics", `{"name":"t2","schema":{"a":1,"a":2}}`, s400, ij),
		bad("create nested too deep", "POST", "/v1/topics", `{"name":"t2","schema":{"x":`+deep+`}}`, s400, ij),
		// Create: schemas that reach outside themselves (audit issue 16, finding 1). The
		// old code read the file, and /dev/ptmx held the request forever (the client's
		// timeout fails the case).
		bad("create schema ref /etc/passwd", "POST", "/v1/topics", `{"name":"t2","schema":{"$ref":"file:///etc/passwd"}}`, s400, "bad_request"),
		bad("create schema ref /dev/ptmx", "POST", "/v1/topics", `{"name":"t2","schema":{"$ref":"file:///dev/ptmx"}}`, s400, "bad_request"),
		bad("create schema ref http", "POST", "/v1/topics", `{"name":"t2","schema":{"$ref":"http://127.0.0.1:9/x.json"}}`, s400, "bad_request"),
		bad("create schema $schema a file", "POST", "/v1/topics", `{"name":"t2","schema":{"$schema":"file:///etc/hostname"}}`, s400, "bad_request"),
		bad("patch schema ref /etc/passwd", "PATCH", "/v1/topics/t", `{"schema":{"$ref":"file:///etc/passwd"}}`, s400, "bad_request"),
		// Create: schema budgets (audit issue 16, finding 2).
		bad("create schema anyOf chain", "POST", "/v1/topics", `{"name":"t2","schema":`+anyOfChain(40)+`}`, s400, "schema_too_complex"),
		bad("create schema self reference", "POST", "/v1/topics", `{"name":"t2","schema":{"$ref":"#"}}`, s400, "schema_too_complex"),
		bad("create schema reference cycle", "POST", "/v1/topics", `{"name":"t2","schema":{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"anyOf":[{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"}}`, s400, "schema_too_complex"),
		bad("create schema 2400 patterns", "POST", "/v1/topics", `{"name":"t2","schema":{"anyOf":[`+patterns(2400)+`]}}`, s400, "schema_too_complex"),
		bad("create schema over 64 KiB", "POST", "/v1/topics", `{"name":"t2","schema":{"description":"`+strings.Repeat("x", 64<<10)+`"}}`, s400, "schema_too_complex"),
		bad("patch schema anyOf chain", "PATCH", "/v1/topics/t", `{"schema":`+anyOfChain(40)+`}`, s400, "schema_too_complex"),
		// Create: ranges.
		bad("create partitions 0", "POST", "/v1/topics", `{"name":"t2","partitions":0}`, s400, ij, ip),
		bad("create partitions 257", "POST", "/v1/topics", `{"name":"t2","partitions":257}`, s400, ij, ip),
		bad("create partitions -1", "POST", "/v1/topics", `{"name":"t2","partitions":-1}`, s400, ij, ip),
		bad("create visibility 0", "POST", "/v1/topics", `{"name":"t2","visibility_timeout_ms":0}`, s400, ij, ip),
		bad("create visibility 99", "POST", "/v1/topics", `{"name":"t2","visibility_timeout_ms":99}`, s400, ij, ip),
		bad("create visibility negative", "POST", "/v1/topics", `{"name":"t2","visibility_timeout_ms":-1000}`, s400, ij, ip),
		bad("create visibility over 12h", "POST", "/v1/topics", `{"name":"t2","visibility_timeout_ms":43200001}`, s400, ij, ip),
		bad("create retention too small", "POST", "/v1/topics", `{"name":"t2","retention_ms":999}`, s400, ij, ip),
		bad("create retention too large", "POST", "/v1/topics", `{"name":"t2","retention_ms":315360000001}`, s400, ij, ip),
		bad("create in-flight 0", "POST", "/v1/topics", `{"name":"t2","max_in_flight_per_partition":0}`, s400, ij, ip),
		bad("create acked-ahead too large", "POST", "/v1/topics", `{"name":"t2","max_acked_ahead_per_partition":1000001}`, s400, ij, ip),
		bad("create replication 0", "POST", "/v1/topics", `{"name":"t2","replication_factor":0}`, s400, ij, ip),
		bad("create replication 3 on one node", "POST", "/v1/topics", `{"name":"t2","replication_factor":3}`, s400, ij, ip),
		bad("create partitions 2^31", "POST", "/v1/topics", `{"name":"t2","partitions":2147483648}`, s400, ij, ip),
		// Create: names.
		bad("create name empty", "POST", "/v1/topics", `{"name":""}`, s400, in),
		bad("create name ..", "POST", "/v1/topics", `{"name":".."}`, s400, in),
		bad("create name .", "POST", "/v1/topics", `{"name":"."}`, s400, in),
		bad("create name a/b", "POST", "/v1/topics", `{"name":"a/b"}`, s400, in),
		bad("create name a%2Fb", "POST", "/v1/topics", `{"name":"a%2Fb"}`, s400, in),
		bad("create name NUL", "POST", "/v1/topics", `{"name":"a\u0000b"}`, s400, in),
		bad("create name 250 chars", "POST", "/v1/topics", `{"name":"`+name250+`"}`, s400, in),
		bad("create name non-ASCII", "POST", "/v1/topics", `{"name":"caf\u00e9"}`, s400, in),
		bad("create name space", "POST", "/v1/topics", `{"name":"a b"}`, s400, in),
		bad("create existing", "POST", "/v1/topics", `{"name":"t"}`, http.StatusConflict, "topic_exists"),
		// JSON must be UTF-8: invalid bytes are refused, not replaced (issue 16 #11).
		bad("create schema not UTF-8", "POST", "/v1/topics", "{\"name\":\"t2\",\"schema\":{\"title\":\"caf\xe9\"}}", s400, ij),
		bad("patch schema not UTF-8", "PATCH", "/v1/topics/t", "{\"schema\":{\"title\":\"\xff\"}}", s400, ij),
		bad("attach child not UTF-8", "POST", "/v1/topics/t/children", "{\"child\":\"other\xc3\"}", s400, ij),
		// Unknown query parameters are refused like unknown body fields: a misspelt
		// ?partiton=1 must not produce to any partition (issue 16 #11).
		bad("produce partiton", "POST", "/v1/topics/t/produce?partiton=1", `1`, s400, ip),
		bad("produce-batch query", "POST", "/v1/topics/t/produce-batch?partition=1", `{"messages":[{"payload":1}]}`, s400, ip),
		bad("consume wiat", "GET", "/v1/topics/t/consume?wiat=5s", "", s400, ip),
		bad("consume-batch maxx", "GET", "/v1/topics/t/consume-batch?maxx=5", "", s400, ip),
		bad("ack extnd", "POST", "/v1/topics/t/ack?extnd=5s&receipt_handle="+held.ReceiptHandle, "", s400, ip),
		bad("replay form", "GET", "/v1/topics/t/partitions/0/messages?form=0", "", s400, ip),
		bad("create with query", "POST", "/v1/topics?partitions=1", `{"name":"t2"}`, s400, ip),
		bad("list topics query", "GET", "/v1/topics?prefix=a", "", s400, ip),
		bad("delete topic query", "DELETE", "/v1/topics/t?force=true", "", s400, ip),
		// Alter.
		bad("patch partitions", "PATCH", "/v1/topics/t", `{"partitions":3}`, s400, ij, ip),
		bad("patch bad json", "PATCH", "/v1/topics/t", `{`, s400, ij),
		bad("patch wrong type", "PATCH", "/v1/topics/t", `{"retention_ms":"1"}`, s400, ij),
		bad("patch visibility 0", "PATCH", "/v1/topics/t", `{"visibility_timeout_ms":0}`, s400, ij, ip),
		bad("patch visibility over 12h", "PATCH", "/v1/topics/t", `{"visibility_timeout_ms":43200001}`, s400, ij, ip),
		bad("patch two values", "PATCH", "/v1/topics/t", `{"retention_ms":5000} []`, s400, ij),
		bad("patch unknown field", "PATCH", "/v1/topics/t", `{"name":"u"}`, s400, ij),
		// Names in the path.
		bad("get a%2Fb", "GET", "/v1/topics/a%2Fb", "", s400, in),
		bad("get NUL", "GET", "/v1/topics/a%00b", "", s400, in),
		bad("get 250 chars", "GET", "/v1/topics/"+name250, "", s400, in),
		bad("get non-ASCII", "GET", "/v1/topics/caf%C3%A9", "", s400, in),
		bad("delete a%2Fb", "DELETE", "/v1/topics/a%2Fb", "", s400, in),
		bad("patch a%2Fb", "PATCH", "/v1/topics/a%2Fb", `{}`, s400, in),
		bad("produce a%2Fb", "POST", "/v1/topics/a%2Fb/produce", `{}`, s400, in),
		bad("consume NUL", "GET", "/v1/topics/a%00b/consume", "", s400, in),
		bad("replay 250 chars", "GET", "/v1/topics/"+name250+"/partitions/0/messages", "", s400, in),
		// Produce.
		bad("produce invalid json", "POST", "/v1/topics/t/produce", `{"a":`, s400, "invalid_payload"),
		bad("produce empty json", "POST", "/v1/topics/t/produce", ` `, s400, "invalid_payload"),
		{name: "produce text invalid utf-8", method: "POST", path: "/v1/topics/t/produce", body: []byte{'o', 'k', 0xff}, hdr: []string{"Content-Type", "text/plain"}, status: s400, codes: []string{"invalid_payload"}},
		{name: "produce bad content type", method: "POST", path: "/v1/topics/t/produce", body: []byte("x"), hdr: []string{"Content-Type", "text/"}, status: s400, codes: []string{"bad_request", "invalid_payload"}},
		bad("produce partition out of range", "POST", "/v1/topics/t/produce?partition=2", `1`, s400, ip),
		bad("produce partition negative", "POST", "/v1/topics/t/produce?partition=-1", `1`, s400, ip),
		bad("produce partition not a number", "POST", "/v1/topics/t/produce?partition=one", `1`, s400, ip),
		bad("produce partition 2^31", "POST", "/v1/topics/t/produce?partition=2147483648", `1`, s400, ip),
		bad("produce key not UTF-8", "POST", "/v1/topics/t/produce?key=a%FFb", `1`, s400, ip),
		bad("batch key over 1024 bytes", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":1,"key":"`+strings.Repeat("k", 1025)+`"}]}`, s400, ip, ij),
		bad("produce key over 1024 bytes", "POST", "/v1/topics/t/produce?key="+strings.Repeat("k", 1025), `1`, s400, ip),
		bad("produce schema bomb", "POST", "/v1/topics/bomb/produce", strings.Repeat("[", 40)+strings.Repeat("]", 40), s400, "schema_too_complex"),
		bad("batch schema bomb", "POST", "/v1/topics/bomb/produce-batch", `{"messages":[{"payload":[]},{"payload":`+strings.Repeat("[", 40)+strings.Repeat("]", 40)+`}]}`, s400, "schema_too_complex"),
		// Nesting deeper than 128 breaks consumers' decoders (audit issue 16, finding 6).
		bad("produce json 5000 deep", "POST", "/v1/topics/t/produce", strings.Repeat("[", 5000)+strings.Repeat("]", 5000), s400, "invalid_payload"),
		bad("produce json 129 deep", "POST", "/v1/topics/t/produce", strings.Repeat(`{"a":`, 129)+"1"+strings.Repeat("}", 129), s400, "invalid_payload"),
		{name: "produce sniffed json 5000 deep", method: "POST", path: "/v1/topics/t/produce", body: []byte(strings.Repeat("[", 5000) + strings.Repeat("]", 5000)), status: s400, codes: []string{"invalid_payload"}},
		bad("batch payload 5000 deep", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":1},{"payload":`+strings.Repeat("[", 5000)+strings.Repeat("]", 5000)+`}]}`, s400, "invalid_payload"),
		// Produce-batch: refused whole.
		bad("batch of 1001", "POST", "/v1/topics/t/produce-batch", string(msgs(1001)), s400, "bad_request", ij),
		bad("batch empty", "POST", "/v1/topics/t/produce-batch", `{"messages":[]}`, s400, "bad_request", ij),
		bad("batch bad json", "POST", "/v1/topics/t/produce-batch", `{"messages":[`, s400, ij),
		bad("batch two values", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":1}]} {"messages":[{"payload":2}]}`, s400, ij),
		bad("batch unknown field", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":1,"colour":2}]}`, s400, ij),
		bad("batch missing payload", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":1},{"key":"k"}]}`, s400, ij),
		bad("batch one bad base64", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":1},{"payload":"aGk=","payload_encoding":"base64"},{"payload":"!!not base64!!","payload_encoding":"base64"}]}`, s400, "invalid_payload"),
		bad("batch base64 not a string", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":1},{"payload":12,"payload_encoding":"base64"}]}`, s400, "invalid_payload"),
		// null where the spec wants a string or an integer: the decoder would take it as
		// absent (schemathesis finding S4).
		bad("batch partition null", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":1,"partition":null}]}`, s400, ij),
		bad("batch key null", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":1,"key":null}]}`, s400, ij),
		bad("batch encoding null", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":"aGk=","payload_encoding":null}]}`, s400, ij),
		bad("batch unknown encoding", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":"aGk=","payload_encoding":"hex"}]}`, s400, ij),
		bad("batch partition out of range", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":1},{"payload":2,"partition":2}]}`, s400, ip),
		bad("batch key too long", "POST", "/v1/topics/t/produce-batch", `{"messages":[{"payload":1},{"payload":2,"key":"`+strings.Repeat("k", 1025)+`"}]}`, s400, ip, ij),
		bad("batch message over 1 MiB", "POST", "/v1/topics/t/produce-batch",
			`{"messages":[{"payload":1},{"payload":"`+base64.StdEncoding.EncodeToString(make([]byte, 1<<20+1))+`","payload_encoding":"base64"}]}`, s413, "payload_too_large"),
		// Consume.
		bad("consume wait abc", "GET", "/v1/topics/t/consume?wait=abc", "", s400, ip),
		bad("consume wait -1", "GET", "/v1/topics/t/consume?wait=-1", "", s400, ip),
		bad("consume wait -1s", "GET", "/v1/topics/t/consume?wait=-1s", "", s400, ip),
		bad("consume wait 21s", "GET", "/v1/topics/t/consume?wait=21s", "", s400, ip),
		bad("consume wait 21", "GET", "/v1/topics/t/consume?wait=21", "", s400, ip),
		// Longer than the spec's maxLength, though it would parse (finding S4).
		bad("consume wait 33 zeros", "GET", "/v1/topics/t/consume?wait="+strings.Repeat("0", 33), "", s400, ip),
		bad("consume-batch wait 33 zeros", "GET", "/v1/topics/t/consume-batch?wait="+strings.Repeat("0", 33), "", s400, ip),
		bad("consume wait huge", "GET", "/v1/topics/t/consume?wait=99999999999999999999", "", s400, ip),
		bad("consume partition without offset", "GET", "/v1/topics/t/consume?partition=0", "", s400, ip),
		bad("consume offset without partition", "GET", "/v1/topics/t/consume?offset=0", "", s400, ip),
		bad("consume offset negative", "GET", "/v1/topics/t/consume?partition=0&offset=-1", "", s400, ip),
		bad("consume offset 2^63", "GET", "/v1/topics/t/consume?partition=0&offset=9223372036854775808", "", s400, ip),
		bad("consume partition out of range", "GET", "/v1/topics/t/consume?partition=2&offset=0", "", s404, "partition_not_found"),
		bad("consume partition negative", "GET", "/v1/topics/t/consume?partition=-1&offset=0", "", s400, ip),
		bad("consume bad encoding", "GET", "/v1/topics/t/consume?payload_encoding=hex", "", s400, ip),
		bad("consume-batch max 0", "GET", "/v1/topics/t/consume-batch?max=0", "", s400, ip),
		bad("consume-batch max 1001", "GET", "/v1/topics/t/consume-batch?max=1001", "", s400, ip),
		bad("consume-batch max abc", "GET", "/v1/topics/t/consume-batch?max=abc", "", s400, ip),
		bad("consume-batch wait 21s", "GET", "/v1/topics/t/consume-batch?wait=21s", "", s400, ip),
		// Replay.
		bad("replay from negative", "GET", "/v1/topics/t/partitions/0/messages?from=-1", "", s400, ip),
		bad("replay from 2^63", "GET", "/v1/topics/t/partitions/0/messages?from=9223372036854775808", "", s400, ip),
		bad("replay from abc", "GET", "/v1/topics/t/partitions/0/messages?from=abc", "", s400, ip),
		bad("replay partition out of range", "GET", "/v1/topics/t/partitions/2/messages", "", s404, "partition_not_found"),
		bad("replay partition huge", "GET", "/v1/topics/t/partitions/2147483647/messages", "", s404, "partition_not_found"),
		bad("replay partition negative", "GET", "/v1/topics/t/partitions/-1/messages", "", s400, ip),
		bad("replay partition abc", "GET", "/v1/topics/t/partitions/abc/messages", "", s400, ip),
		bad("replay max 0", "GET", "/v1/topics/t/partitions/0/messages?max=0", "", s400, ip),
		bad("replay max 1001", "GET", "/v1/topics/t/partitions/0/messages?max=1001", "", s400, ip),
		bad("replay from_time garbage", "GET", "/v1/topics/t/partitions/0/messages?from_time=yesterday", "", s400, ip),
		bad("replay from_time over 64 chars", "GET", "/v1/topics/t/partitions/0/messages?from_time="+strings.Repeat("1", 65), "", s400, ip),
		bad("replay bad encoding", "GET", "/v1/topics/t/partitions/0/messages?payload_encoding=raw", "", s400, ip),
		// Ack.
		bad("ack garbage handle", "POST", "/v1/topics/t/ack?receipt_handle=garbage", "", s400, "invalid_receipt_handle"),
		bad("ack truncated handle", "POST", "/v1/topics/t/ack?receipt_handle="+held.ReceiptHandle[:len(held.ReceiptHandle)-4], "", s400, "invalid_receipt_handle"),
		bad("ack tampered handle", "POST", "/v1/topics/t/ack?receipt_handle="+string(tampered), "", s400, "invalid_receipt_handle"),
		bad("ack handle too long", "POST", "/v1/topics/t/ack?receipt_handle="+strings.Repeat("A", 600), "", s400, "invalid_receipt_handle", ip),
		bad("ack handle of another topic", "POST", "/v1/topics/t/ack?receipt_handle="+foreign.ReceiptHandle, "", 0, "invalid_receipt_handle", "lease_lost"),
		bad("ack no handle", "POST", "/v1/topics/t/ack", "", s400, ip),
		bad("ack empty handle", "POST", "/v1/topics/t/ack?receipt_handle=", "", s400, ip),
		bad("ack extend abc", "POST", "/v1/topics/t/ack?extend=abc&receipt_handle="+held.ReceiptHandle, "", s400, ip),
		bad("ack extend -5", "POST", "/v1/topics/t/ack?extend=-5&receipt_handle="+held.ReceiptHandle, "", s400, ip),
		bad("ack extend -5s", "POST", "/v1/topics/t/ack?extend=-5s&receipt_handle="+held.ReceiptHandle, "", s400, ip),
		bad("ack extend 13h", "POST", "/v1/topics/t/ack?extend=13h&receipt_handle="+held.ReceiptHandle, "", s400, ip),
		bad("ack extend 12h+1ms", "POST", "/v1/topics/t/ack?extend=43200001&receipt_handle="+held.ReceiptHandle, "", s400, ip),
		bad("ack extend empty", "POST", "/v1/topics/t/ack?extend=&receipt_handle="+held.ReceiptHandle, "", s400, ip),
		bad("ack extend 33 zeros", "POST", "/v1/topics/t/ack?extend="+strings.Repeat("0", 33)+"&receipt_handle="+held.ReceiptHandle, "", s400, ip),
		bad("ack-batch extend 33 zeros", "POST", "/v1/topics/t/ack-batch", `{"acks":[{"receipt_handle":"`+held.ReceiptHandle+`","extend":"`+strings.Repeat("0", 33)+`"}]}`, s400, ij),
		bad("ack-batch handle empty", "POST", "/v1/topics/t/ack-batch", `{"acks":[{"receipt_handle":"`+held.ReceiptHandle+`"},{"receipt_handle":""}]}`, s400, ij),
		bad("ack-batch handle 513 chars", "POST", "/v1/topics/t/ack-batch", `{"acks":[{"receipt_handle":"`+strings.Repeat("A", 513)+`"}]}`, s400, ij),
		bad("ack-batch extend null", "POST", "/v1/topics/t/ack-batch", `{"acks":[{"receipt_handle":"`+held.ReceiptHandle+`","extend":null}]}`, s400, ij),
		bad("ack extend huge", "POST", "/v1/topics/t/ack?extend=99999999999999999999&receipt_handle="+held.ReceiptHandle, "", s400, ip),
		bad("ack-batch empty", "POST", "/v1/topics/t/ack-batch", `{"acks":[]}`, s400, "bad_request", ij),
		bad("ack-batch 1001", "POST", "/v1/topics/t/ack-batch", string(acks(1001)), s400, "bad_request", ij),
		bad("ack-batch bad json", "POST", "/v1/topics/t/ack-batch", `{"acks":`, s400, ij),
		bad("ack-batch two values", "POST", "/v1/topics/t/ack-batch", `{"acks":[{"receipt_handle":"`+held.ReceiptHandle+`"}]} {}`, s400, ij),
		bad("ack-batch unknown field", "POST", "/v1/topics/t/ack-batch", `{"acks":[{"receipt_handle":"x","nack":true}]}`, s400, ij),
		bad("ack-batch handle a number", "POST", "/v1/topics/t/ack-batch", `{"acks":[{"receipt_handle":5}]}`, s400, ij),
		// Unknown topic on every topic route.
		bad("get unknown", "GET", "/v1/topics/nope", "", s404, "topic_not_found"),
		bad("patch unknown", "PATCH", "/v1/topics/nope", `{"retention_ms":5000}`, s404, "topic_not_found"),
		bad("delete unknown", "DELETE", "/v1/topics/nope", "", s404, "topic_not_found"),
		bad("produce unknown", "POST", "/v1/topics/nope/produce", `{"a":1}`, s404, "topic_not_found"),
		bad("produce-batch unknown", "POST", "/v1/topics/nope/produce-batch", `{"messages":[{"payload":1}]}`, s404, "topic_not_found"),
		bad("consume unknown", "GET", "/v1/topics/nope/consume", "", s404, "topic_not_found"),
		bad("consume replay unknown", "GET", "/v1/topics/nope/consume?partition=0&offset=0", "", s404, "topic_not_found"),
		bad("consume-batch unknown", "GET", "/v1/topics/nope/consume-batch", "", s404, "topic_not_found"),
		bad("ack unknown", "POST", "/v1/topics/nope/ack?receipt_handle="+held.ReceiptHandle, "", s404, "topic_not_found"),
		bad("ack-batch unknown", "POST", "/v1/topics/nope/ack-batch", `{"acks":[{"receipt_handle":"`+held.ReceiptHandle+`"}]}`, s404, "topic_not_found"),
		bad("replay unknown", "GET", "/v1/topics/nope/partitions/0/messages", "", s404, "topic_not_found"),
		// Routes and methods.
		bad("unknown route", "GET", "/v1/topic", "", s404, "not_found"),
		bad("unknown nested route", "POST", "/v1/topics/t/produce/now", `{}`, s404, "not_found"),
		bad("wrong method", "DELETE", "/v1/topics/t/consume", "", http.StatusMethodNotAllowed, "method_not_allowed"),
		bad("wrong method on produce", "PUT", "/v1/topics/t/produce", `{}`, http.StatusMethodNotAllowed, "method_not_allowed"),
	}
	for _, c := range cases {
		r := a.Do(c.method, c.path, c.body, c.hdr...)
		label := c.name + " (" + c.method + " " + truncate(c.path, 80) + ")"
		code, _, err := testutil.ParseError(r.Body)
		switch {
		case err != nil:
			t.Errorf("%s: %d with a body that is not the JSON error shape: %v", label, r.Status, err)
		case c.status != 0 && r.Status != c.status:
			t.Errorf("%s: status %d (%s), want %d", label, r.Status, code, c.status)
		case !slices.Contains(c.codes, code):
			t.Errorf("%s: code %q, want one of %v", label, code, c.codes)
		case c.status == 0 && (r.Status < 400 || r.Status >= 500):
			t.Errorf("%s: status %d (%s), want a 4xx", label, r.Status, code)
		}
		if after := snapshot(a); !reflect.DeepEqual(after, before) {
			t.Fatalf("%s changed the broker's state:\nbefore %+v\nafter  %+v", label, before, after)
		}
	}
	// The refusal of an unknown query parameter names the known ones.
	r := a.Do("POST", "/v1/topics/t/produce?partiton=1", []byte("1"))
	if _, msg, _ := testutil.ParseError(r.Body); !strings.Contains(msg, "partiton") || !strings.Contains(msg, "partition") || !strings.Contains(msg, "key") {
		t.Errorf("unknown query parameter: message %q, want it to name partiton and the known partition and key", msg)
	}
	// The lease the bad acks aimed at is intact.
	a.mustAck("t", held)
}

// anyOfChain is a schema whose every level refers to the next twice: checking a
// payload costs 2^levels.
func anyOfChain(levels int) string {
	var defs []string
	for i := 0; i < levels; i++ {
		next := fmt.Sprintf(`{"$ref":"#/$defs/a%d"}`, i+1)
		defs = append(defs, fmt.Sprintf(`"a%d":{"anyOf":[%s,{"allOf":[%s],"type":"object"}]}`, i, next, next))
	}
	defs = append(defs, fmt.Sprintf(`"a%d":{"type":"string"}`, levels))
	return `{"$defs":{` + strings.Join(defs, ",") + `},"$ref":"#/$defs/a0"}`
}

// patterns is n distinct pattern subschemas, comma-separated.
func patterns(n int) string {
	p := make([]string, n)
	for i := range p {
		p[i] = fmt.Sprintf(`{"pattern":"a%d"}`, i)
	}
	return strings.Join(p, ",")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// TestProduceSizeLimit: a message is at most 1 MiB. One byte more is 413 whether the
// length is declared or the body is chunked, and nothing is stored; exactly 1 MiB is
// accepted and comes back whole.
func TestProduceSizeLimit(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("big", map[string]any{"partitions": 1})
	limit := 1 << 20
	over := bytes.Repeat([]byte{0xab}, limit+1)
	exact := bytes.Repeat([]byte{0xcd}, limit)

	send := func(body []byte, chunked bool) (int, string) {
		t.Helper()
		var rd io.Reader = bytes.NewReader(body)
		if chunked {
			rd = io.MultiReader(rd) // hides the length: net/http sends it chunked
		}
		req, err := http.NewRequest(http.MethodPost, a.BaseURL()+"/v1/topics/big/produce", rd)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		if chunked && req.ContentLength != 0 {
			t.Fatalf("request has a Content-Length %d", req.ContentLength)
		}
		r, err := a.Send(req)
		if err != nil {
			t.Fatalf("produce of %d bytes (chunked %v): %v", len(body), chunked, err)
		}
		return r.Status, r.ErrorCode()
	}
	for _, chunked := range []bool{false, true} {
		if st, code := send(over, chunked); st != http.StatusRequestEntityTooLarge || code != "payload_too_large" {
			t.Errorf("1 MiB + 1 (chunked %v): %d %q, want 413 payload_too_large", chunked, st, code)
		}
		if ps := a.topic("big").PartitionStats[0]; ps.NextOffset != 0 {
			t.Fatalf("a refused message was stored: %+v", ps)
		}
	}
	for i, chunked := range []bool{false, true} {
		if st, _ := send(exact, chunked); st != http.StatusAccepted {
			t.Errorf("exactly 1 MiB (chunked %v): %d, want 202", chunked, st)
		}
		m := a.consume("big", "partition=0&offset="+fmt.Sprint(i))
		if m == nil || !bytes.Equal(m.bytesOf(t), exact) {
			t.Errorf("the 1 MiB message did not come back whole")
		}
	}
}

// TestProduceBatchSizeLimit: a batch body may be up to 8 MiB; one over is 413 and
// nothing is written.
func TestProduceBatchSizeLimit(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("pb", map[string]any{"partitions": 2})
	chunk := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 300_000))
	batch := func(n int) []byte {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = `{"payload":"` + chunk + `","payload_encoding":"base64"}`
		}
		return []byte(`{"messages":[` + strings.Join(parts, ",") + `]}`)
	}
	// About 2 MB of JSON: over the 1 MiB of other bodies, well under 8 MiB.
	r := a.PostJSON("/v1/topics/pb/produce-batch", batch(5))
	var res struct {
		Results []produced `json:"results"`
	}
	if r.Expect(t, http.StatusAccepted) && r.JSON(t, &res) && len(res.Results) != 5 {
		t.Errorf("%d results for 5 messages", len(res.Results))
	}
	over := batch(21) // 21 × 400 kB > 8 MiB
	if len(over) <= 8<<20 {
		t.Fatalf("test bug: %d bytes is not over 8 MiB", len(over))
	}
	before := snapshot(a)
	a.PostJSON("/v1/topics/pb/produce-batch", over).ExpectError(t, http.StatusRequestEntityTooLarge, "payload_too_large")
	if after := snapshot(a); !reflect.DeepEqual(after, before) {
		t.Errorf("a refused batch changed the state: %+v -> %+v", before, after)
	}
}

// TestBadUserInput: user, password and grant bodies that are not valid UTF-8 are
// refused with 400 (a JSON decoder would put U+FFFD in place of the bad bytes, and a
// password stored that way could never be typed back), and nothing is stored.
func TestBadUserInput(t *testing.T) {
	t.Parallel()
	n, admin := startSecured(t)
	admin.createUser("u", "u-password")
	send := func(method, path string, body []byte) *testutil.Response {
		return admin.Do(method, path, body, "Content-Type", "application/json")
	}
	bad := []struct {
		name, method, path string
		body               []byte
	}{
		{"password", "POST", "/v1/users", []byte("{\"username\":\"x1\",\"password\":\"pass\xffword\"}")},
		{"password, U+FFFD escaped", "POST", "/v1/users", []byte(`{"username":"x2","password":"pass\ufffdword"}`)},
		{"username", "POST", "/v1/users", []byte("{\"username\":\"x\xff3\",\"password\":\"password-3\"}")},
		{"grant pattern", "POST", "/v1/users", []byte("{\"username\":\"x4\",\"password\":\"password-4\",\"grants\":[{\"action\":\"produce\",\"topics\":[\"a\xff\"]}]}")},
		{"grant action", "PUT", "/v1/users/u/grants", []byte("{\"grants\":[{\"action\":\"produce\xff\",\"topics\":[\"a\"]}]}")},
		{"grants pattern", "PUT", "/v1/users/u/grants", []byte("{\"grants\":[{\"action\":\"produce\",\"topics\":[\"\xfe\xff\"]}]}")},
		{"new password", "PUT", "/v1/users/u/password", []byte("{\"new_password\":\"new-pass\xc3\"}")},
	}
	for _, c := range bad {
		r := send(c.method, c.path, c.body)
		if r.Status != http.StatusBadRequest || r.ErrorCode() == "" {
			t.Errorf("%s not UTF-8: %d %s, want 400 with an error code", c.name, r.Status, r.Body)
		}
	}
	var l struct{ Users []struct{ Username string } }
	admin.Get("/v1/users").JSON(t, &l)
	if len(l.Users) != 2 {
		t.Errorf("users after the refused bodies: %+v, want admin and u only", l.Users)
	}
	var u struct{ Grants []any }
	admin.Get("/v1/users/u").JSON(t, &u)
	if len(u.Grants) != 0 {
		t.Errorf("u's grants changed by a refused body: %+v", u.Grants)
	}
	n.Client().WithBasicAuth("u", "u-password").Get("/v1/users/u").Expect(t, http.StatusOK)
}

// TestErrorsEchoLittle: an error message repeats at most a little of what the client
// sent; a megabyte of bad value does not come back as a megabyte of error.
func TestErrorsEchoLittle(t *testing.T) {
	t.Parallel()
	_, a := startBroker(t)
	a.createTopic("s", map[string]any{"partitions": 1, "schema": map[string]any{
		"type": "object", "properties": map[string]any{"a": map[string]any{"type": "string", "pattern": "^b"}},
	}})
	long := strings.Repeat("a", 512<<10)
	r := a.Do("POST", "/v1/topics/s/produce", []byte(`{"a":"`+long+`"}`), "Content-Type", "application/json")
	r.ExpectError(t, http.StatusBadRequest, "schema_violation")
	if len(r.Body) > 2048 {
		t.Errorf("a schema violation of a 512 KiB value answered with %d bytes: %.300s…", len(r.Body), r.Body)
	}
	_, msg, _ := testutil.ParseError(r.Body)
	if !strings.Contains(msg, "…") || !strings.Contains(msg, "/a") {
		t.Errorf("message %.300q: want it to name /a and mark the cut value with …", msg)
	}
	// A key as long as the body allows, against a schema that forbids extra keys.
	a.createTopic("closed", map[string]any{"partitions": 1, "schema": map[string]any{"type": "object", "additionalProperties": false}})
	r = a.Do("POST", "/v1/topics/closed/produce", []byte(`{"`+long+`":1}`), "Content-Type", "application/json")
	r.ExpectError(t, http.StatusBadRequest, "schema_violation")
	if len(r.Body) > 2048 {
		t.Errorf("a schema violation with a 512 KiB key answered with %d bytes: %.300s…", len(r.Body), r.Body)
	}
}
