package broker

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestAttachingAMissingChildNamesIt: attaching a child that does not exist answered
// "no such topic", which a caller reads as the parent in the URL, which exists. The
// error names the child now, and stays a not-found.
func TestAttachingAMissingChildNamesIt(t *testing.T) {
	t.Parallel()
	b := mustStartBroker(t, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	if _, err := b.CreateTopic(ctx, TopicSpec{Name: "p", Partitions: ptr[int32](1)}); err != nil {
		t.Fatal(err)
	}
	_, err := b.AttachChild(ctx, "p", "absent", 0)
	if !errors.Is(err, ErrTopicNotFound) || !strings.Contains(err.Error(), `no topic "absent" to attach as a child`) {
		t.Fatalf("attach of a missing child: %v; want a not-found naming the child", err)
	}
	_, err = b.AttachChild(ctx, "gone", "p", 0)
	if !errors.Is(err, ErrTopicNotFound) || strings.Contains(err.Error(), "to attach as a child") {
		t.Fatalf("attach under a missing parent: %v; want the plain not-found", err)
	}
}
