package broker

import (
	"encoding/base64"
	"strconv"
	"unicode/utf8"

	"github.com/narad-mq/narad/broker/internal/jsonstr"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// batch appends to b the produce-batch body of recs from parent partition pp and says
// how many messages it holds: each message with its key, payload kind, timestamp and
// origin, placed as fan-out places copies (the same partition index when the counts
// match, else by key; keyless: pp modulo the remote's count). Copies from elsewhere are
// left out.
//
// The body is written by hand, not by encoding/json: a stored JSON payload is valid
// JSON already (it was checked at produce), and re-validating every payload of every
// batch was most of the copy's CPU.
func (c *remoteCopier) batch(b []byte, pp int, recs []segment.Record) ([]byte, int) {
	cluster := c.b.ClusterID()
	b = append(b, `{"incarnation":`...)
	b = jsonstr.Append(b, c.rc.RemoteIncarnation)
	b = append(b, `,"messages":[`...)
	sent := 0
	for _, r := range recs {
		if r.Attrs&AttrRemoteCopy != 0 {
			continue
		}
		if sent > 0 {
			b = append(b, ',')
		}
		sent++
		b = append(b, `{"timestamp":`...)
		b = strconv.AppendInt(b, r.Timestamp, 10)
		b = append(b, `,"origin":{"cluster_id":`...)
		b = jsonstr.Append(b, cluster)
		b = append(b, `,"topic":`...)
		b = jsonstr.Append(b, c.parent.name)
		b = append(b, `,"partition":`...)
		b = strconv.AppendInt(b, int64(pp), 10)
		b = append(b, `,"offset":`...)
		b = strconv.AppendUint(b, r.Offset, 10)
		b = append(b, '}')
		if r.Key != nil {
			b = append(b, `,"key":`...)
			b = jsonstr.Append(b, string(r.Key))
		}
		if rp := c.sentPartition(pp, r); rp >= 0 {
			b = append(b, `,"partition":`...)
			b = strconv.AppendInt(b, int64(rp), 10)
		}
		switch r.Attrs & PayloadKindMask {
		case PayloadKindJSON:
			b = append(b, `,"payload":`...)
			b = append(b, r.Value...)
		case PayloadKindText:
			b = append(b, `,"payload_encoding":"text","payload":`...)
			b = jsonstr.Append(b, string(r.Value))
		default:
			b = append(b, `,"payload_encoding":"base64","payload":"`...)
			b = base64.StdEncoding.AppendEncode(b, r.Value)
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	return append(b, "]}"...), sent
}

// remotePartition is the remote partition the remote stores r of parent partition pp
// in, as batch places it; -1 when the remote chooses (a keyless message when its
// partition count is not known) or the key is not sent as it is (not UTF-8).
func (c *remoteCopier) remotePartition(pp int, r segment.Record) int {
	if rp := c.sentPartition(pp, r); rp >= 0 || c.rc.RemotePartitions <= 0 || r.Key == nil || !utf8.Valid(r.Key) {
		return rp
	}
	return PartitionForKey(r.Key, int(c.rc.RemotePartitions))
}

// sentPartition is the remote partition batch names for r of parent partition pp (the
// same index when the counts match; keyless: pp modulo the remote's count), or -1 when
// it names none (the remote places the message by its key, or its count is not known).
func (c *remoteCopier) sentPartition(pp int, r segment.Record) int {
	n := int(c.rc.RemotePartitions)
	switch {
	case n <= 0:
		return -1
	case n == len(c.parent.parts()):
		return pp
	case r.Key == nil:
		return pp % n
	}
	return -1
}
