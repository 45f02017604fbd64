//go:build chaosnet

package raftetcd

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/transport"
)

// TestChaosNetDeafLeaderIsReplaced: a leader that still sends but hears nothing (its
// node plane drops every packet it receives) cannot commit, so its groups must elect
// another leader as fast as after a crash. Its peers still hear its frames and its
// liveness calls; only calls of their own that come back prove it alive to them.
// When hearing it was enough, its groups kept it as their leader until its QUIC
// connections died of silence, seconds later.
func TestChaosNetDeafLeaderIsReplaced(t *testing.T) {
	const groups = 6
	rules := make([]string, 3)
	dir := t.TempDir()
	ns := startClusterOn(t, groups, func(*Options) {}, func(i int) {
		rules[i] = filepath.Join(dir, "rules-"+string(rune('1'+i)))
		if err := os.WriteFile(rules[i], nil, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Setenv(transport.ChaosNetEnvVar, rules[i])
	})
	ls := leaders(t, ns, groups)
	for g := range groups {
		propose(t, ls[groupName(g)], groupName(g))
	}
	deaf, led := busiest(ns, ls)
	if err := os.WriteFile(rules[deaf.id-1]+".tmp", []byte("drop in 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(rules[deaf.id-1]+".tmp", rules[deaf.id-1]); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var others []*testNode
	for _, n := range ns {
		if n != deaf {
			others = append(others, n)
		}
	}
	// Liveness (1 s here) plus an election, with room for a loaded machine; the
	// connections of the deaf node die of silence only after 15 s.
	poll(t, 6*time.Second, "the deaf leader's groups elect another leader", func() bool {
		for g := range groups {
			if ls[groupName(g)] != deaf {
				continue
			}
			for _, n := range others {
				info, _ := n.host.Info(groupName(g))
				if info.Lead == 0 || info.Lead == deaf.id {
					return false
				}
			}
		}
		return true
	})
	t.Logf("%d groups of the deaf node elected another leader after %v", led, time.Since(start).Round(10*time.Millisecond))
	// They commit without it.
	for g := range groups {
		if ls[groupName(g)] == deaf {
			var lead *testNode
			info, _ := others[0].host.Info(groupName(g))
			for _, n := range others {
				if n.id == info.Lead {
					lead = n
				}
			}
			if lead == nil {
				t.Fatalf("group %s: leader %d is not one of the hearing nodes", groupName(g), info.Lead)
			}
			propose(t, lead, groupName(g))
		}
	}
}
