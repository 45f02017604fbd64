package meta

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// memberSinceFile holds, in the metadata directory, the index of the first metadata
// command (or restored snapshot) whose state showed this data directory's Raft server
// id as a member. It belongs to this disk only and is not replicated.
//
// A replica of a partition created before that index was made for a group that existed
// before this disk did (the node lost its disk, or joined later), so it joins the group
// instead of starting it; a partition created after it is started by its replicas. A
// topic's incarnation is the index of the command that created it, so the two are
// compared on the metadata log's own order, never on wall clocks of different nodes
// (which a skew of a few seconds once sent every replica of a new topic to join a group
// nobody started).
const memberSinceFile = "member-since"

func loadMemberSince(dir string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(dir, memberSinceFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || v == 0 {
		return 0, fmt.Errorf("meta: %s is damaged (%q); delete it and the node records it again when it starts (at its newest metadata snapshot's index at the latest)", filepath.Join(dir, memberSinceFile), b)
	}
	return v, nil
}

// noteSelf records index as the first state showing this node a member, once. Called
// with the state in place (after Apply or Restore), without f.mu held.
func (f *fsm) noteSelf(index uint64) {
	if f.self == "" || index == 0 || f.selfSince.Load() != 0 {
		return
	}
	f.mu.RLock()
	found := false
	for _, m := range f.members {
		found = found || m.ServerID == f.self
	}
	f.mu.RUnlock()
	if !found {
		return
	}
	f.selfSince.Store(index)
	if f.onSelf != nil {
		f.onSelf(index)
	}
}

// MemberSince is the index of the first metadata state that showed this data
// directory's server id as a member (see memberSinceFile); 0 while it is not known.
func (s *Store) MemberSince() uint64 { return s.fsm.selfSince.Load() }

// saveMemberSince is the fsm's onSelf: it writes the index durably. A failure is
// logged; the node then decides by creation time until the next start records it.
func (s *Store) saveMemberSince(index uint64) {
	if err := vfs.WriteFileSync(filepath.Join(s.opts.Dir, memberSinceFile), []byte(strconv.FormatUint(index, 10)+"\n")); err != nil {
		s.opts.Logger.Error("meta: recording when this node became a member failed", "index", index, "err", err)
		return
	}
	s.opts.Logger.Info("meta: recorded the metadata index at which this data directory became a member", "index", index)
}
