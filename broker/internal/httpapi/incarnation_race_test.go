package httpapi

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/broker"
)

// TestAlterAndDeleteActOnTheTopicTheyAuthorized: alice owns topic t; between the check
// of her rights and the action, t is deleted and bob creates t again. Her delete or
// alter was authorized on her topic, so it must not reach bob's: 404, and bob's topic
// stays as it was.
func TestAlterAndDeleteActOnTheTopicTheyAuthorized(t *testing.T) {
	b, err := broker.Open(broker.Options{DataDir: t.TempDir(), NodeID: "n1",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RetentionInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	grants := []auth.Grant{{Action: auth.Create, Topics: []string{"t"}}, {Action: auth.Produce, Topics: []string{"t"}}}
	alice, err := b.CreateUser(ctx, "alice", "alice-password-1", grants)
	if err != nil {
		t.Fatal(err)
	}
	bob, err := b.CreateUser(ctx, "bob", "bob-password-12", grants)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(b, Options{Logger: quietLogger(), AuthEnabled: func() bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { authorizedHook = nil }()
	for _, c := range []struct {
		name, method, body string
	}{
		{"delete", http.MethodDelete, ""},
		{"alter", http.MethodPatch, `{"retention_ms":60000}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := b.CreateTopic(ctx, broker.TopicSpec{Name: "t", OwnerID: alice.ID}); err != nil {
				t.Fatal(err)
			}
			var bobs uint64
			authorizedHook = func(req any) {
				switch req.(type) {
				case apigen.DeleteTopicRequestObject, apigen.AlterTopicRequestObject:
				default:
					return
				}
				authorizedHook = nil
				if err := b.DeleteTopic(ctx, "t", 0); err != nil {
					t.Error(err)
				}
				bt, err := b.CreateTopic(ctx, broker.TopicSpec{Name: "t", OwnerID: bob.ID})
				if err != nil {
					t.Error(err)
				}
				bobs = bt.Incarnation
			}
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(c.method, "/v1/topics/t", strings.NewReader(c.body))
			req.Host = "127.0.0.1"
			req.SetBasicAuth("alice", "alice-password-1")
			if c.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			h.ServeHTTP(rec, req)
			if bobs == 0 {
				t.Fatalf("the hook never ran: %d %s", rec.Code, rec.Body.String())
			}
			if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "topic_not_found") {
				t.Errorf("alice's %s authorized on her topic, run against bob's: %d %s, want 404 topic_not_found", c.name, rec.Code, rec.Body.String())
			}
			cur, _, err := b.Topic("t")
			if err != nil {
				t.Fatalf("bob's topic is gone: %v", err)
			}
			if cur.Incarnation != bobs || cur.OwnerID != bob.ID || cur.RetentionMs == 60000 {
				t.Errorf("bob's topic was changed: incarnation %d (his %d), owner %d (bob %d), retention %d", cur.Incarnation, bobs, cur.OwnerID, bob.ID, cur.RetentionMs)
			}
			if err := b.DeleteTopic(ctx, "t", 0); err != nil {
				t.Fatal(err)
			}
		})
	}
}
