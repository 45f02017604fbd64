package raftetcd

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestADeferredSnapshotIsNotLoggedAsAFailure: an application that defers its snapshot
// for a reason it expects to pass (ErrSnapshotDeferred: a replicated partition applying
// its group's log again) is asked again later, and the group logs that once at debug
// level, not as a failure at every try. On the old code each try logged an error; the
// first snapshot of a group made over data is tried after every Ready.
func TestADeferredSnapshotIsNotLoggedAsAFailure(t *testing.T) {
	t.Parallel()
	logs := &slogger{}
	h, dir, _ := soleHost(t, false, logs.logger())
	for _, first := range []bool{false, true} {
		g := fmt.Sprint("g-first-", first)
		app := &snapApp{}
		app.apps = map[uint64]*snapApp{1: app}
		var tries atomic.Int32
		snapshot := func() ([]byte, error) {
			if tries.Add(1) <= 4 {
				return nil, fmt.Errorf("the partition applies its log again: %w", ErrSnapshotDeferred)
			}
			return app.snapshot()
		}
		cfg := GroupConfig{Voters: []uint64{1}, Dir: filepath.Join(dir, g), Campaign: true, SnapshotFirst: first,
			Apply: app.apply, Snapshot: snapshot, Restore: app.restore}
		if err := h.OpenGroup(g, cfg); err != nil {
			t.Fatal(err)
		}
		poll(t, 20*time.Second, g+": the group to lead", func() bool {
			info, _ := h.Info(g)
			return info.Leader
		})
		for i := 0; ; i++ {
			if info, _ := h.Info(g); info.Snapshots > 0 {
				break
			}
			if i == 200 {
				t.Fatalf("%s: no snapshot after %d writes and %d tries", g, i, tries.Load())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_, err := h.Propose(ctx, g, []byte(fmt.Sprint("v", i)))
			cancel()
			if err != nil {
				t.Fatalf("%s: write %d: %v", g, i, err)
			}
		}
		if n := tries.Load(); n < 5 {
			t.Fatalf("%s: the application was asked %d times; want 4 deferrals and a snapshot", g, n)
		}
		h.CloseGroup(g)
	}
	failures, deferrals := logs.counts()
	if len(failures) > 0 {
		t.Errorf("deferred snapshots were logged as failures: %q", failures)
	}
	if deferrals != 2 {
		t.Errorf("the deferrals of two groups were logged %d times at debug level; want once each", deferrals)
	}
}

// slogger records what a host logs about snapshots.
type slogger struct {
	mu        sync.Mutex
	failures  []string // warnings and errors about snapshots
	deferrals int      // debug records of a deferred snapshot
}

func (s *slogger) logger() *slog.Logger { return slog.New(slogHandler{s}) }

func (s *slogger) counts() ([]string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.failures...), s.deferrals
}

type slogHandler struct{ s *slogger }

func (h slogHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h slogHandler) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "snapshot") {
		return nil
	}
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	switch {
	case r.Level >= slog.LevelWarn:
		h.s.failures = append(h.s.failures, r.Message)
	case r.Level == slog.LevelDebug && strings.Contains(r.Message, "deferred"):
		h.s.deferrals++
	}
	return nil
}

func (h slogHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h slogHandler) WithGroup(string) slog.Handler      { return h }
