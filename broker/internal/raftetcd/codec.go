package raftetcd

import (
	"encoding/binary"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
)

// A batch frame (OpBatch) carries every raft message one node has for one peer at
// that moment, of any number of groups:
//
//	repeated: u8 group length, group, u8 flags, u32 message length, raftpb.Message
//
// flagQuiesce marks a leader's last heartbeat before it stops ticking the group: the
// follower stops its election clock for the group too. The answer is empty: raft
// messages are one-way, and a lost one is raft's to retry.
const flagQuiesce byte = 1

type outMsg struct {
	group string
	flags byte
	m     raftpb.Message
}

func encodeBatch(dst []byte, msgs []outMsg) []byte {
	for i := range msgs {
		o := &msgs[i]
		n := o.m.Size()
		dst = append(dst, byte(len(o.group)))
		dst = append(dst, o.group...)
		dst = append(dst, o.flags)
		dst = binary.BigEndian.AppendUint32(dst, uint32(n))
		start := len(dst)
		dst = append(dst, make([]byte, n)...)
		_, _ = o.m.MarshalTo(dst[start:])
	}
	return dst
}

func decodeBatch(b []byte, each func(group string, flags byte, m raftpb.Message)) error {
	for len(b) > 0 {
		gl := int(b[0])
		if len(b) < 1+gl+5 {
			return fmt.Errorf("%w: short batch item", ErrBadMessage)
		}
		group := string(b[1 : 1+gl])
		flags := b[1+gl]
		n := int(binary.BigEndian.Uint32(b[2+gl:]))
		b = b[6+gl:]
		if len(b) < n {
			return fmt.Errorf("%w: message of %d bytes, %d left", ErrBadMessage, n, len(b))
		}
		var m raftpb.Message
		if err := m.Unmarshal(b[:n]); err != nil {
			return fmt.Errorf("%w: %v", ErrBadMessage, err)
		}
		b = b[n:]
		each(group, flags, m)
	}
	return nil
}
