package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
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
// holds no clear text and opens only for the record it was sealed for. When a rotation
// begins (the new secret set as the next one) it still opens but is stale, and the
// controller seals the stored one again under the new secret, so it opens once the
// rotation ends; a password still sealed under the old secret then no longer opens.
func TestSealedPasswordFollowsTheClusterSecret(t *testing.T) {
	resealInterval.Store(int64(20 * time.Millisecond))
	defer resealInterval.Store(int64(5 * time.Second))
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

	// A stored remote child, sealed under the first secret.
	ctx := context.Background()
	m, err := b.CreateTopic(ctx, TopicSpec{Name: "orders", Partitions: ref(int32(1))})
	if err != nil {
		t.Fatal(err)
	}
	rc := meta.RemoteChild{Parent: "orders", ParentIncarnation: m.Incarnation, URL: "http://127.0.0.1:1", Topic: "orders",
		Username: "copier", RemoteIncarnation: "1", RemotePartitions: 1, Start: "now", Cursors: []uint64{0}}
	if rc.Sealed, err = b.sealPassword(pw, remoteAAD(rc)); err != nil {
		t.Fatal(err)
	}
	if rc, err = b.meta.AttachRemoteChild(rc); err != nil {
		t.Fatal(err)
	}

	// Step 1 of a rotation: the new secret is the next one.
	s.set("first-cluster-secret-0001", "second-cluster-secret-002")
	if got, stale, err := b.openPassword(sealed, aad); err != nil || got != pw || !stale {
		t.Fatalf("open during the rotation: %q stale=%v %v, want the password, stale", got, stale, err)
	}
	waitUntil(t, "the controller to seal the stored password again", func() bool {
		r, ok := b.meta.RemoteChild(rc.ID)
		return ok && !b.staleSeal(r.Sealed)
	})
	// Step 2: the new secret is the only one.
	s.set("second-cluster-secret-002", "")
	if _, _, err := b.openPassword(sealed, aad); !errors.Is(err, ErrCredentialsSealed) {
		t.Fatalf("open under a secret that is gone: %v, want ErrCredentialsSealed", err)
	}
	r, _ := b.meta.RemoteChild(rc.ID)
	if got, stale, err := b.openPassword(r.Sealed, remoteAAD(r)); err != nil || got != pw || stale {
		t.Fatalf("open of the stored password after the rotation: %q stale=%v %v", got, stale, err)
	}
}

// TestLoneNodeKeyLivesOutsideMeta: a node without a cluster secret seals under a key
// file of its own, private and outside meta/, and opens with it after a restart.
func TestLoneNodeKeyLivesOutsideMeta(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	if got, _, err := readRange(b, ctx, "t", 0, ref(uint64(0)), nil, 10); err != nil || len(got) != 0 {
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
	got, _, err := readRange(b, ctx, "t", 0, ref(uint64(0)), nil, 10)
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

// TestRemoteBatchBody: the hand-written produce-batch body decodes (by encoding/json)
// to what the records hold: payload kinds, keys needing escapes or not UTF-8, the
// timestamp, the origin and the placement; a copy from elsewhere is left out.
func TestRemoteBatchBody(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	parent := &topic{name: "orders"}
	parts := make([]*partition.Partition, 2)
	parent.partsP.Store(&parts)
	c := &remoteCopier{b: b, parent: parent, rc: meta.RemoteChild{RemoteIncarnation: "42", RemotePartitions: 3}}
	recs := []segment.Record{
		{Offset: 7, Timestamp: 1000, Key: []byte("k\"\\\n\x01é"), Value: []byte(`{"a": [1, "x"]}`), Attrs: PayloadKindJSON},
		{Offset: 8, Timestamp: 1001, Value: []byte("text \"quoted\"\t\u2028 \xff"), Attrs: PayloadKindText},
		{Offset: 9, Timestamp: 1002, Key: []byte{0xff, 'k'}, Value: []byte{0, 1, 255}, Attrs: PayloadKindBinary},
		{Offset: 10, Timestamp: 1003, Value: []byte(`1`), Attrs: PayloadKindJSON | AttrRemoteCopy},
	}
	body, n := c.batch(nil, 1, recs)
	if n != 3 {
		t.Fatalf("%d messages in the batch, want 3 (the copy left out)", n)
	}
	var req apigen.ProduceBatchRequest
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatalf("the body is not JSON: %v\n%s", err, body)
	}
	if req.Incarnation == nil || *req.Incarnation != "42" || len(req.Messages) != 3 {
		t.Fatalf("batch: %s", body)
	}
	want := []struct {
		key     *string
		part    *int32
		payload string
		enc     string
	}{
		{ref("k\"\\\n\x01é"), nil, `{"a": [1, "x"]}`, ""},
		{nil, ref(int32(1)), `"text \"quoted\"\t\u2028 \ufffd"`, "text"},
		{ref("\ufffdk"), nil, `"AAH/"`, "base64"},
	}
	for i, m := range req.Messages {
		w := want[i]
		if (m.Key == nil) != (w.key == nil) || (m.Key != nil && *m.Key != *w.key) {
			t.Errorf("message %d: key %v, want %v", i, m.Key, w.key)
		}
		if (m.Partition == nil) != (w.part == nil) || (m.Partition != nil && *m.Partition != *w.part) {
			t.Errorf("message %d: partition %v, want %v", i, m.Partition, w.part)
		}
		var got, exp any
		if json.Unmarshal(m.Payload, &got) != nil || json.Unmarshal([]byte(w.payload), &exp) != nil || !reflect.DeepEqual(got, exp) {
			t.Errorf("message %d: payload %s, want %s", i, m.Payload, w.payload)
		}
		enc := ""
		if m.PayloadEncoding != nil {
			enc = string(*m.PayloadEncoding)
		}
		if enc != w.enc || m.Timestamp == nil || *m.Timestamp != recs[i].Timestamp {
			t.Errorf("message %d: encoding %q timestamp %v", i, enc, m.Timestamp)
		}
		if o := m.Origin; o == nil || o.ClusterId != b.ClusterID() || o.Topic != "orders" || o.Partition != 1 || o.Offset != int64(recs[i].Offset) {
			t.Errorf("message %d: origin %+v", i, m.Origin)
		}
	}
}
