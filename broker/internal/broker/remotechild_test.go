package broker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/partition"
)

// secrets is a cluster secret that a test rotates.
type secrets struct {
	mu        sync.Mutex
	cur, next []byte
}

func (s *secrets) get() ([]byte, []byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.next, nil
}

func (s *secrets) set(cur, next string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur, s.next = []byte(cur), []byte(next)
	if next == "" {
		s.next = nil
	}
}

func startWithSecrets(t *testing.T, s *secrets) *Broker {
	t.Helper()
	b, err := Open(Options{DataDir: t.TempDir(), NodeID: "n1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), SecretKeys: s.get})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// TestSealedPasswordFollowsTheClusterSecret: a password sealed under the cluster secret
// holds no clear text, opens only for the record it was sealed for, still opens during
// and after a rotation that keeps the old secret as the next one (marked stale, to be
// sealed again), and no longer opens once the secret it was sealed under is gone.
func TestSealedPasswordFollowsTheClusterSecret(t *testing.T) {
	s := &secrets{}
	s.set("first-cluster-secret-0001", "")
	b := startWithSecrets(t, s)
	const pw = "remote-password-42"
	aad := []byte("orders\x00https://dr:7942\x00orders\x00copier")
	sealed, err := b.sealPassword(pw, aad)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte(pw)) {
		t.Fatal("the sealed password holds the password in clear")
	}
	if got, stale, err := b.openPassword(sealed, aad); err != nil || got != pw || stale {
		t.Fatalf("open: %q stale=%v %v", got, stale, err)
	}
	if _, _, err := b.openPassword(sealed, []byte("other\x00record")); !errors.Is(err, ErrCredentialsSealed) {
		t.Fatalf("open for another record: %v, want ErrCredentialsSealed", err)
	}
	s.set("second-cluster-secret-002", "first-cluster-secret-0001")
	if got, stale, err := b.openPassword(sealed, aad); err != nil || got != pw || !stale {
		t.Fatalf("open after rotation: %q stale=%v %v, want the password, stale", got, stale, err)
	}
	resealed, err := b.sealPassword(pw, aad)
	if err != nil {
		t.Fatal(err)
	}
	s.set("second-cluster-secret-002", "")
	if _, _, err := b.openPassword(sealed, aad); !errors.Is(err, ErrCredentialsSealed) {
		t.Fatalf("open under a secret that is gone: %v, want ErrCredentialsSealed", err)
	}
	if got, stale, err := b.openPassword(resealed, aad); err != nil || got != pw || stale {
		t.Fatalf("open of the password sealed again: %q stale=%v %v", got, stale, err)
	}
}

// TestLoneNodeKeyLivesOutsideMeta: a node without a cluster secret seals under a key
// file of its own, private and outside meta/, and opens with it after a restart.
func TestLoneNodeKeyLivesOutsideMeta(t *testing.T) {
	dir := t.TempDir()
	b := mustStartBroker(t, dir)
	sealed, err := b.sealPassword("remote-password-42", nil)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, credentialsKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v, want mode 0600", fi, err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = mustStartBroker(t, dir)
	defer b.Close()
	if got, _, err := b.openPassword(sealed, nil); err != nil || got != "remote-password-42" {
		t.Fatalf("open after restart: %q %v", got, err)
	}
}

// TestProduceChecked: a batch naming another incarnation writes nothing, validate-only
// writes nothing, a copy from this cluster's own topic is refused, and a copy keeps its
// source's timestamp (a future one becomes now).
func TestProduceChecked(t *testing.T) {
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "t", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	inc := strconv.FormatUint(m.Incarnation, 10)
	msg := []Outgoing{{Partition: 0, Value: []byte("x")}}
	if _, err := b.ProduceChecked(ctx, "t", ProduceCheck{Incarnation: inc + "1"}, msg); !errors.Is(err, ErrIncarnationMismatch) {
		t.Fatalf("another incarnation: %v", err)
	}
	if _, err := b.ProduceChecked(ctx, "t", ProduceCheck{Incarnation: inc, ValidateOnly: true}, msg); err != nil {
		t.Fatalf("validate only: %v", err)
	}
	self := ProduceCheck{Origins: []Origin{{ClusterID: b.ClusterID(), Topic: "t"}}}
	if _, err := b.ProduceChecked(ctx, "t", self, msg); !isConflict(err) {
		t.Fatalf("a copy of this very topic: %v, want a conflict", err)
	}
	if got, _, err := b.Read(ctx, "t", 0, ref(uint64(0)), nil, 10); err != nil || len(got) != 0 {
		t.Fatalf("refused and validate-only batches stored %d messages (%v)", len(got), err)
	}
	old := partition.WallMillis() - 3_600_000
	future := partition.WallMillis() + 3_600_000
	if _, err := b.ProduceChecked(ctx, "t", ProduceCheck{Incarnation: inc}, []Outgoing{
		{Partition: 0, Value: []byte("a"), Timestamp: old, Attrs: AttrRemoteCopy},
		{Partition: 0, Value: []byte("b"), Timestamp: future},
	}); err != nil {
		t.Fatal(err)
	}
	got, _, err := b.Read(ctx, "t", 0, ref(uint64(0)), nil, 10)
	if err != nil || len(got) != 2 {
		t.Fatalf("read: %d %v", len(got), err)
	}
	if got[0].Timestamp != old || got[0].Attrs&AttrRemoteCopy == 0 {
		t.Fatalf("copy stored with timestamp %d attrs %x, want %d with the copy mark", got[0].Timestamp, got[0].Attrs, old)
	}
	if got[1].Timestamp >= future || got[1].Timestamp < old {
		t.Fatalf("a future timestamp was stored as %d (now is about %d)", got[1].Timestamp, future-3_600_000)
	}
}
