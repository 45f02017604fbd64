package broker

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

func leaseAnswers() []*dataResp {
	big := bytes.Repeat([]byte{0, 0xff, '{'}, 100_000)
	return []*dataResp{
		{},
		{Err: &wireErr{Code: "not_leader", Msg: "partition 3 of topic \"t\" \xff moved", Leader: "n2"}},
		{Deliveries: []partition.Delivery{
			{Record: segment.Record{Offset: 0, Timestamp: 0, Value: []byte{}}},
			{Record: segment.Record{Offset: 1<<64 - 1, Timestamp: -1 << 63, Key: []byte{}, Value: []byte(`{"a":1}`), Attrs: 1<<16 - 1},
				Nonce: queue.Nonce{Epoch: 1<<32 - 1, Seq: 1<<64 - 1}, Attempt: 1<<32 - 1},
			{Record: segment.Record{Offset: 42, Timestamp: 1_764_800_000_000, Key: []byte("customer-7"), Value: big, Attrs: 2},
				Nonce: queue.Nonce{Epoch: 3, Seq: 99}, Attempt: 2},
		}},
		{Deliveries: []partition.Delivery{{Record: segment.Record{Offset: 5, Value: []byte("x")}, Attempt: 1}},
			Err: &wireErr{Code: "storage_failed", Msg: "after one"}},
		{Attended: true},
		{Attended: true, Deliveries: []partition.Delivery{{Record: segment.Record{Offset: 9, Key: []byte("k"), Value: []byte("v")}, Attempt: 3}}},
	}
}

// leaseForms are the lease requests of entry nodes that read the binary form: of the
// release that brought it (version 1), and of this one (version 2, attendance too).
var leaseForms = []struct {
	req     dataReq
	version byte
}{
	{dataReq{Kind: dataLease, Bin: true}, binAnswerV1},
	{dataReq{Kind: dataLease, Bin: true, Attend: true}, binAnswerV2},
}

// The binary form reads back exactly what was sent, and exactly what the JSON form
// reads: the entry node cannot tell which form an answer came in.
func TestBinLeaseReadsAsJSONDoes(t *testing.T) {
	t.Parallel()
	for _, form := range leaseForms {
		for i, resp := range leaseAnswers() {
			if resp.Attended && !form.req.Attend {
				continue // a holder says so only when asked
			}
			bin, err := encodeAnswer(&form.req, resp)
			if err != nil {
				t.Fatal(err)
			}
			if bin[0] != binAnswerMagic || bin[1] != form.version {
				t.Fatalf("answer %d to %+v: not in the binary form's version %d: % x", i, form.req, form.version, bin[:2])
			}
			got, err := decodeAnswer(bin)
			if err != nil {
				t.Fatalf("answer %d: %v", i, err)
			}
			js, err := encodeAnswer(&dataReq{Kind: dataLease, Attend: form.req.Attend}, resp)
			if err != nil {
				t.Fatal(err)
			}
			if js[0] != '{' {
				t.Fatalf("answer %d: a request without bin was answered in the binary form", i)
			}
			viaJSON, err := decodeAnswer(js)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, viaJSON) {
				t.Errorf("answer %d, version %d: the binary form reads\n%+v\nthe JSON form reads\n%+v", i, form.version, got, viaJSON)
			}
			want := *resp
			if want.Err != nil {
				want.Err = viaJSON.Err // the JSON of an error message replaces invalid UTF-8
			}
			if !reflect.DeepEqual(got, &want) {
				t.Errorf("answer %d, version %d: sent\n%+v\nread\n%+v", i, form.version, &want, got)
			}
			for _, d := range got.Deliveries {
				if d.Record.Value == nil {
					t.Errorf("answer %d: a value read as nil (a record's value is never nil on read)", i)
				}
			}
		}
	}
}

// Version 1 cannot say a partition is attended, and version 2 refuses flags it does
// not know rather than guess at them.
func TestBinLeaseAttendance(t *testing.T) {
	t.Parallel()
	if _, err := appendBinLease(nil, &dataResp{Attended: true}, binAnswerV1); err == nil {
		t.Error("version 1 took an attended answer, which it has no room for")
	}
	for flags, want := range map[byte]bool{0: false, binAttended: true} {
		resp, err := decodeBinLease([]byte{binAnswerMagic, binAnswerV2, flags, 0, 0})
		if err != nil || resp.Attended != want {
			t.Errorf("flags %#x read as attended=%v, %v; want %v", flags, resp != nil && resp.Attended, err, want)
		}
	}
	if _, err := decodeBinLease([]byte{binAnswerMagic, binAnswerV2, 2, 0, 0}); err == nil {
		t.Error("an unknown flag was read")
	}
	if _, err := decodeBinLease([]byte{binAnswerMagic, 3, 0, 0, 0}); err == nil {
		t.Error("version 3 was read")
	}
}

// Only a lease answer asked for in the binary form goes in it; anything else, and
// every other kind of request, is JSON as before.
func TestBinAnswerOnlyForLeases(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		req  dataReq
		resp dataResp
	}{
		{dataReq{Kind: dataLease}, dataResp{}},
		{dataReq{Kind: dataRead, Bin: true}, dataResp{Records: []segment.Record{{Value: []byte("x")}}}},
		{dataReq{Kind: dataLease, Bin: true}, dataResp{Stats: &queue.Stats{}}},
		{dataReq{Kind: dataSettle, Bin: true}, dataResp{Errs: []*wireErr{nil}}},
	} {
		out, err := encodeAnswer(&c.req, &c.resp)
		if err != nil {
			t.Fatal(err)
		}
		if out[0] != '{' {
			t.Errorf("%+v answered in the binary form", c.req)
		}
	}
}

// The binary form writes every field of a delivery: a field added to it, to its record
// or to its nonce must be added to the form too (and this count). A field added to
// dataResp must be checked by isLeaseAnswer, or a lease answer holding it would lose it.
func TestBinLeaseCoversEveryField(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		v    any
		want int
	}{{partition.Delivery{}, 3}, {segment.Record{}, 5}, {queue.Nonce{}, 2}, {dataResp{}, 13}} {
		if n := reflect.TypeOf(c.v).NumField(); n != c.want {
			t.Errorf("%T has %d fields; the binary lease answer (wirebin.go) carries %d", c.v, n, c.want)
		}
	}
}

// A malformed binary answer is an error, never a panic or a huge allocation.
func FuzzDecodeBinLease(f *testing.F) {
	for _, form := range leaseForms {
		for _, resp := range leaseAnswers() {
			if resp.Attended && !form.req.Attend {
				continue
			}
			b, err := appendBinLease(nil, resp, form.version)
			if err != nil {
				f.Fatal(err)
			}
			if len(b) < 4096 {
				f.Add(b)
			}
		}
	}
	f.Add([]byte{0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{0, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		resp, err := decodeBinLease(data)
		if err != nil {
			return
		}
		again, err := appendBinLease(nil, resp, data[1])
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeBinLease(again)
		if err != nil || !reflect.DeepEqual(back, resp) {
			t.Fatalf("a decoded answer does not survive its own round trip: %v", err)
		}
	})
}
