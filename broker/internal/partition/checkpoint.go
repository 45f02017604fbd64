package partition

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/narad-mq/narad/broker/internal/failpoint"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// A checkpoint file holds the queue state as of a journal position:
//
//	magic "NQCK" | version u8 | frontier u64 | journal next u64 | n u32 | n × offset u64 | CRC-32C u32
//
// all big-endian, the CRC over everything before it. It is written to a temporary file,
// fsynced, renamed over the old one and the directory fsynced, so a crash leaves either
// the old or the new checkpoint whole.
const (
	ckptName    = "queue.ckpt"
	epochName   = "epoch"
	ckptVersion = 1
)

var ckptMagic = []byte("NQCK")

var crcTable = crc32.MakeTable(crc32.Castagnoli)

type checkpoint struct {
	frontier    uint64
	journalNext uint64
	ackedAhead  []uint64
}

// Checkpoint writes the queue state and drops the journal segments it covers.
func (p *Partition) Checkpoint() error {
	p.checkpoints.Lock()
	defer p.checkpoints.Unlock()
	defer func() {
		p.mu.Lock()
		p.ckptRunning = false
		p.mu.Unlock()
	}()

	p.gate.Lock()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.gate.Unlock()
		return ErrClosed
	}
	ck := checkpoint{frontier: p.q.Frontier(), journalNext: p.journal.Next(), ackedAhead: p.q.AckedAhead()}
	p.sinceCkpt = 0
	p.mu.Unlock()
	p.gate.Unlock()
	raceHook("checkpoint") // the state copied, nothing written yet

	slices.Sort(ck.ackedAhead)
	b := make([]byte, 0, 4+1+8+8+4+8*len(ck.ackedAhead)+4)
	b = append(b, ckptMagic...)
	b = append(b, ckptVersion)
	b = binary.BigEndian.AppendUint64(b, ck.frontier)
	b = binary.BigEndian.AppendUint64(b, ck.journalNext)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ck.ackedAhead)))
	for _, o := range ck.ackedAhead {
		b = binary.BigEndian.AppendUint64(b, o)
	}
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
	if err := p.writeFileAtomic(ckptName, b); err != nil {
		return fmt.Errorf("partition %d: writing checkpoint: %w", p.opts.Index, err)
	}
	if _, err := p.journal.DeleteBefore(ck.journalNext); err != nil && !errors.Is(err, segment.ErrClosed) {
		return fmt.Errorf("partition %d: compacting settle journal: %w", p.opts.Index, err)
	}
	return nil
}

func (p *Partition) readCheckpoint() (checkpoint, error) {
	b, err := p.readFile(ckptName)
	if errors.Is(err, fs.ErrNotExist) {
		return checkpoint{}, nil
	}
	if err != nil {
		return checkpoint{}, err
	}
	bad := func(why string) (checkpoint, error) {
		return checkpoint{}, fmt.Errorf("partition %d: checkpoint %s is corrupt (%s); refusing to start rather than redeliver or lose settled state: %w",
			p.opts.Index, filepath.Join(p.opts.Dir, ckptName), why, segment.ErrCorrupt)
	}
	if len(b) < 4+1+8+8+4+4 || string(b[:4]) != string(ckptMagic) {
		return bad("bad header")
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, crcTable) != sum {
		return bad("checksum mismatch")
	}
	if body[4] != ckptVersion {
		return bad(fmt.Sprintf("unknown version %d", body[4]))
	}
	ck := checkpoint{frontier: binary.BigEndian.Uint64(body[5:]), journalNext: binary.BigEndian.Uint64(body[13:])}
	n := binary.BigEndian.Uint32(body[21:])
	rest := body[25:]
	if uint64(len(rest)) != 8*uint64(n) {
		return bad("length mismatch")
	}
	for i := uint32(0); i < n; i++ {
		ck.ackedAhead = append(ck.ackedAhead, binary.BigEndian.Uint64(rest[8*i:]))
	}
	return ck, nil
}

// bumpEpoch reads the lease epoch of the previous opening, adds one and stores it
// durably before any lease is handed out, so no lease nonce is ever issued twice.
func (p *Partition) bumpEpoch() (uint32, error) {
	var e uint32
	b, err := p.readFile(epochName)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return 0, err
	case len(b) != 8 || crc32.Checksum(b[:4], crcTable) != binary.BigEndian.Uint32(b[4:]):
		return 0, fmt.Errorf("partition %d: epoch file is corrupt: %w", p.opts.Index, segment.ErrCorrupt)
	default:
		e = binary.BigEndian.Uint32(b)
	}
	// The epoch also never falls below the seconds since 2024: a data dir restored from a
	// backup holds an old epoch, and handing out epochs already used after that backup
	// would let a stale receipt handle match a new lease.
	e = max(e+1, epochFloor())
	out := binary.BigEndian.AppendUint32(nil, e)
	out = binary.BigEndian.AppendUint32(out, crc32.Checksum(out, crcTable))
	if err := p.writeFileAtomic(epochName, out); err != nil {
		return 0, fmt.Errorf("partition %d: storing epoch: %w", p.opts.Index, err)
	}
	return e, nil
}

func (p *Partition) readFile(name string) ([]byte, error) {
	f, err := p.fs.OpenFile(filepath.Join(p.opts.Dir, name), os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // opened read-only
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	if size > 64<<20 {
		return nil, fmt.Errorf("%s: %d bytes is too large: %w", name, size, segment.ErrCorrupt)
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b, nil
}

func (p *Partition) writeFileAtomic(name string, data []byte) error {
	tmp := filepath.Join(p.opts.Dir, name+".tmp")
	f, err := p.fs.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		_ = f.Close() // the write error is the one to report
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close() // the sync error is the one to report
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	failpoint.Inject(failpoint.PartitionBeforeRename + name)
	if err := p.fs.Rename(tmp, filepath.Join(p.opts.Dir, name)); err != nil {
		return err
	}
	return p.fs.SyncDir(p.opts.Dir)
}

// epochFloor is the wall clock in seconds since 2024-01-01, the least epoch a partition
// opens with. (A restore is safe as long as the partition did not open more often than
// once a second since the backup was taken.)
var epochFloor = func() uint32 {
	secs := WallMillis()/1000 - time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	if secs < 0 {
		return 0
	}
	return uint32(secs)
}
