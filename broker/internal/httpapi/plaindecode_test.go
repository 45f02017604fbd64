package httpapi

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/broker"
)

// TestPlainProduceBatchTakesThePlainShapes pins which produce-batch bodies skip the
// token reader: what the load generator and the SDKs send with byte payloads must
// (else the scanner has silently stopped working), and anything it cannot read as
// the others do must not. Each body taken is held to the token reader and to
// strictDecode (checkFastProduceBatch).
func TestPlainProduceBatchTakesThePlainShapes(t *testing.T) {
	t.Parallel()
	plain := []string{
		`{"messages":[{"payload":"eHh4eA==","payload_encoding":"base64"},{"payload":"eXk=","payload_encoding":"base64"}]}`, // the load generator
		`{"messages":[{"key":"k1","partition":3,"payload":"eHh4","payload_encoding":"base64","timestamp":1700000000000}]}`, // the Go SDK's member order
		`{"messages": [{"payload": "aGk=", "payload_encoding": "base64", "key": "order-7", "partition": 0}]}`,              // Python's separators
		" {\n\t\"messages\" : [ ] \r\n} ",
		`{"messages":[{"payload":"","payload_encoding":"text","key":""}]}`,
		"{\"messages\":[{\"payload\":\"a\x7fb~ !#/<>&'\",\"payload_encoding\":\"text\"}]}",
		`{"messages":[{}]}`,
		`{"messages":[{"payload":"x","timestamp":9223372036854775807,"partition":2147483647}]}`,
	}
	for _, s := range plain {
		if _, ok := plainProduceBatch([]byte(s)); !ok {
			t.Errorf("produce-batch body %q: not taken by the plain scanner", s)
		}
		checkFastProduceBatch(t, []byte(s))
	}
	// The token reader takes these (or strictDecode answers them); the plain scanner
	// must not.
	for _, s := range []string{
		`{"messages":[{"payload":{"a":1}}]}`,
		`{"messages":[{"payload":1}]}`,
		`{"messages":[{"payload":null}]}`,
		`{"messages":[{"payload":"\u0061"}]}`,
		`{"messages":[{"payload":"a\/b"}]}`,
		`{"messages":[{"payload":"x","key":"caf\u00e9"}]}`,
		"{\"messages\":[{\"payload\":\"x\",\"key\":\"café\"}]}",
		"{\"messages\":[{\"payload\":\"a\tb\"}]}",
		"{\"messages\":[{\"payload\":\"a\x00b\"}]}",
		"{\"messages\":[{\"payload\":\"\xff\"}]}",
		`{"messages":[{"payload":"x","payload_encoding":"hex"}]}`,
		`{"messages":[{"payload":"x","payload_encoding":null}]}`,
		`{"messages":[{"payload":"x","partition":1.0}]}`,
		`{"messages":[{"payload":"x","partition":1e2}]}`,
		`{"messages":[{"payload":"x","partition":-1}]}`,
		`{"messages":[{"payload":"x","partition":-0}]}`,
		`{"messages":[{"payload":"x","partition":01}]}`,
		`{"messages":[{"payload":"x","partition":2147483648}]}`,
		`{"messages":[{"payload":"x","timestamp":9223372036854775808}]}`,
		`{"messages":[{"payload":"x","payload":"y"}]}`,
		`{"messages":[{"payload":"x","key":"a","key":"b"}]}`,
		`{"messages":[{"payload":"x","origin":{"cluster_id":"c","topic":"t","partition":0,"offset":5}}]}`,
		`{"messages":[{"payload":"x","extra":1}]}`,
		`{"messages":[{"payload":"x"}],"incarnation":"7"}`,
		`{"incarnation":"7","messages":[]}`,
		`{"messages":[{"payload":"x"}],"messages":[]}`,
		`{"messages":[{"payload":"x"}],"validate_only":true}`,
		`{"messag\u0065s":[]}`,
		`{"messages":[{"payload":"x"},]}`,
		`{"messages":[{"payload":"x",}]}`,
		`{"messages":[{"payload":"x"}]} x`,
		`{"messages":[{"payload":"x"}]}}`,
		`{"messages":[{"payload":"x"`,
		`{"messages":[{"payload":"x}]}`,
		`{"messages":[,]}`,
		`{"messages":{}}`,
		`{"messages":null}`,
		`[]`,
		``,
	} {
		if _, ok := plainProduceBatch([]byte(s)); ok {
			t.Errorf("produce-batch body %q: taken by the plain scanner; it must go to the token reader", s)
		}
		checkFastProduceBatch(t, []byte(s))
	}
}

// plainByte is the rule plainStringEnd applies to each byte inside a string.
func plainByte(c byte) bool { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\' }

// TestPlainWordStops: the eight-byte test never misses a byte the scanner must stop
// at, in any position and beside any other bytes, and never stops on eight plain
// bytes (else it would do no good).
func TestPlainWordStops(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	var plainBytes []byte
	for c := range 256 {
		if plainByte(byte(c)) {
			plainBytes = append(plainBytes, byte(c))
		}
	}
	var w [8]byte
	for c := range 256 {
		for k := range 8 {
			for range 64 { // beside random bytes of every kind
				for i := range w {
					w[i] = byte(rng.IntN(256))
				}
				w[k] = byte(c)
				stop := !plainByte(byte(c))
				for _, b := range w {
					stop = stop || !plainByte(b)
				}
				if got := plainWordStops(binary.LittleEndian.Uint64(w[:])); stop && !got {
					t.Fatalf("bytes %q: not stopped at; one of them ends a plain string", w)
				}
			}
		}
	}
	for range 100000 {
		for i := range w {
			w[i] = plainBytes[rng.IntN(len(plainBytes))]
		}
		if plainWordStops(binary.LittleEndian.Uint64(w[:])) {
			t.Fatalf("bytes %q: stopped at; all of them are plain", w)
		}
	}
}

// TestPlainStringEnd holds plainStringEnd to a byte-by-byte reading of the same rule,
// over strings of every length around the eight-byte steps.
func TestPlainStringEnd(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	want := func(data []byte, i int) int {
		if i >= len(data) || data[i] != '"' {
			return -1
		}
		for j := i + 1; j < len(data); j++ {
			if data[j] == '"' {
				return j
			}
			if !plainByte(data[j]) {
				return -1
			}
		}
		return -1
	}
	for range 200000 {
		n := rng.IntN(40)
		data := make([]byte, n)
		for i := range data {
			switch r := rng.IntN(100); {
			case r < 2:
				data[i] = '"'
			case r < 3:
				data[i] = byte(rng.IntN(256))
			default:
				data[i] = byte(0x20 + rng.IntN(0x60))
			}
		}
		i := 0
		if n > 0 && rng.IntN(4) > 0 {
			i = rng.IntN(n)
			data[i] = '"'
		}
		if got, w := plainStringEnd(data, i), want(data, i); got != w {
			t.Fatalf("plainStringEnd(%q, %d) = %d; want %d", data, i, got, w)
		}
	}
}

// TestPlainProduceBatchSizesItsListOnce: the list of messages is made once for a batch
// of alike messages, and a small first message before a large one does not make the
// list many times the body's size.
func TestPlainProduceBatchSizesItsListOnce(t *testing.T) {
	t.Parallel()
	body, _ := benchBatchBodies()
	req, ok := plainProduceBatch(body)
	if !ok {
		t.Fatal("the load generator's batch is not taken by the plain scanner")
	}
	if len(req.Messages) != 100 || cap(req.Messages) != 100 {
		t.Fatalf("a batch of 100 alike messages: %d messages in a list made for %d; want 100 in 100", len(req.Messages), cap(req.Messages))
	}
	large := `{"messages":[{},{"payload":"` + strings.Repeat("x", 1<<20) + `"}]}`
	if req, ok = plainProduceBatch([]byte(large)); !ok {
		t.Fatal("a plain body is not taken by the plain scanner")
	}
	if cap(req.Messages) > broker.MaxBatch {
		t.Fatalf("an empty first message before one of 1 MiB: a list made for %d messages; want at most %d", cap(req.Messages), broker.MaxBatch)
	}
}
