package httpapi

import (
	"testing"

	"github.com/narad-mq/narad/broker/internal/jsondepth"
)

// event256 is a typical 256-byte JSON event.
var event256 = []byte(`{"id":"7c0b9c3e-8f1a-4a52-9a57-0d2f3b1d9e41","type":"order.created","at":"2025-11-24T10:15:00Z","customer":{"id":42,"tier":"gold"},"items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"total":{"amount":1999,"currency":"EUR"},"note":"leave at the door, thanks"}`)

// BenchmarkPayloadKindJSON256 is what a JSON produce body costs to check (validity,
// UTF-8, nesting); BenchmarkDepthCheck256 is the nesting check's share of it.
func BenchmarkPayloadKindJSON256(b *testing.B) {
	b.SetBytes(int64(len(event256)))
	b.ReportAllocs()
	for b.Loop() {
		if k, err := payloadKind("application/json", event256); err != nil || k != kindJSON {
			b.Fatal(k, err)
		}
	}
}

func BenchmarkDepthCheck256(b *testing.B) {
	b.SetBytes(int64(len(event256)))
	b.ReportAllocs()
	for b.Loop() {
		if jsondepth.Exceeds(event256, MaxPayloadDepth) {
			b.Fatal("a flat event is too deep")
		}
	}
}
