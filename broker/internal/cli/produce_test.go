package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// runWithServer runs one CLI command against h with stdin.
func runWithServer(t *testing.T, h http.Handler, stdin string, args ...string) ran {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	vars := map[string]string{"NARAD_URL": srv.URL, "NARAD_CLI_CONFIG": filepath.Join(t.TempDir(), "contexts.json")}
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := Run(ctx, args, IO{Stdout: &stdout, Stderr: &stderr, Stdin: strings.NewReader(stdin), Getenv: func(k string) string { return vars[k] }})
	return ran{code, stdout.String(), stderr.String()}
}

// TestABatchProduceThatPartlyFailedSaysWhatWasStored: a --batch produce whose messages
// took two requests (over 7 MiB), the second refused. The messages of the first are
// stored: their partitions and offsets are printed, and the refused ones are named by
// their number. The CLI used to print nothing but the SDK's "check each result".
func TestABatchProduceThatPartlyFailedSaysWhatWasStored(t *testing.T) {
	var mu sync.Mutex
	requests, offset := 0, 0
	var firstCount int
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/topics/t/produce-batch" {
			http.Error(w, `{"error":{"code":"not_found","message":"no route"}}`, http.StatusNotFound)
			return
		}
		var req struct{ Messages []json.RawMessage }
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		requests++
		w.Header().Set("Content-Type", "application/json")
		if requests > 1 {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"code":"bad_request","message":"refused for the test"}}`)
			return
		}
		firstCount = len(req.Messages)
		var res []string
		for range req.Messages {
			res = append(res, fmt.Sprintf(`{"topic":"t","partition":0,"offset":%d}`, offset))
			offset++
		}
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"results":[`+strings.Join(res, ",")+`]}`)
	})
	line := strings.Repeat("a", 900<<10) + "\n"
	r := runWithServer(t, h, strings.Repeat(line, 9), "produce", "t", "--batch")
	if requests != 2 || firstCount == 0 || firstCount == 9 {
		t.Fatalf("the batch took %d requests, the first with %d messages; want two", requests, firstCount)
	}
	var want strings.Builder
	for i := range firstCount {
		fmt.Fprintf(&want, "0\t%d\n", i)
	}
	if r.code != ExitFailed || r.stdout != want.String() ||
		!strings.Contains(r.stderr, fmt.Sprintf("messages %d to 9 not stored", firstCount+1)) ||
		!strings.Contains(r.stderr, fmt.Sprintf("%d of the first 9 messages were stored", firstCount)) {
		t.Fatalf("a batch produce that partly failed: exit %d\nstdout %q\nstderr %s", r.code, r.stdout, r.stderr)
	}
}

// TestAnOverlongLineSendsTheLinesBefore: a line of stdin longer than a message can be
// stops a produce there; the lines before it are sent and printed, with --batch too
// (which used to drop the batch it was filling without a word), and the error names
// the line.
func TestAnOverlongLineSendsTheLinesBefore(t *testing.T) {
	f := &fakeAPI{answers: map[string]fakeAnswer{
		"POST /v1/topics/t/produce":       {202, `{"topic":"t","partition":0,"offset":0}`},
		"POST /v1/topics/t/produce-batch": {202, `{"results":[{"topic":"t","partition":0,"offset":0},{"topic":"t","partition":0,"offset":1}]}`},
	}}
	stdin := "a\n\nb\n" + strings.Repeat("x", 2<<20) + "\nc\n"
	for _, args := range [][]string{{"produce", "t"}, {"produce", "t", "--batch"}} {
		r := runWithServer(t, f, stdin, args...)
		lines := strings.Count(r.stdout, "\n")
		if r.code != ExitFailed || lines != 2 || !strings.Contains(r.stderr, "line 4 of stdin is longer") {
			t.Errorf("%v with an overlong 4th line: exit %d, %d messages printed, stderr %q", args, r.code, lines, r.stderr)
		}
	}
}
