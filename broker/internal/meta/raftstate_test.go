package meta

import (
	"fmt"
	"testing"
)

// TestRaftStateFollowsAFailover: the state behind the control plane's metrics names
// the leader and the followers, and a change of controller moves every survivor's term
// and leader-change count.
func TestRaftStateFollowsAFailover(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	var old *Store
	eventually(t, "one leader", func() error {
		if old = leaderOf(ss...); old == nil {
			return fmt.Errorf("no leader")
		}
		return nil
	})
	before := map[*Store]RaftState{}
	for _, s := range ss {
		st := s.RaftState()
		want := "Follower"
		if s == old {
			want = "Leader"
		}
		if st.State != want || st.Term == 0 || st.AppliedIndex == 0 {
			t.Fatalf("%s: %+v, want state %s, a term and an applied index", s.NodeID(), st, want)
		}
		before[s] = st
	}
	net.close(old)
	var rest []*Store
	for _, s := range ss {
		if s != old {
			rest = append(rest, s)
		}
	}
	eventually(t, "a new leader seen by both survivors", func() error {
		l := leaderOf(rest...)
		if l == nil {
			return fmt.Errorf("no leader yet")
		}
		for _, s := range rest {
			st := s.RaftState()
			if st.Term <= before[s].Term || st.LeaderChanges <= before[s].LeaderChanges {
				return fmt.Errorf("%s: %+v, before %+v", s.NodeID(), st, before[s])
			}
			if s.Controller() != l.NodeID() {
				return fmt.Errorf("%s names controller %q", s.NodeID(), s.Controller())
			}
		}
		if l.RaftState().State != "Leader" {
			return fmt.Errorf("the leader reports %+v", l.RaftState())
		}
		return nil
	})
}
