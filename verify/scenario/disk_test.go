package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/narad-mq/narad/verify/node"
)

// startNode starts a narad (the failpoints build, nothing armed) on dataDir.
func startNode(t *testing.T, dataDir string, args ...string) *node.Node {
	t.Helper()
	bin, err := Binary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Options{Bin: bin, DataDir: dataDir, LogPath: filepath.Join(t.TempDir(), "node.log"), Args: append([]string{"--log-level", "warn", "--shutdown-grace", "2s"}, args...)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	return n
}

type answer struct {
	status int
	code   string
	body   []byte
}

func call(t *testing.T, method, url string, body []byte) answer {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	if body != nil {
		ct := "application/octet-stream"
		if bytes.HasPrefix(body, []byte("{")) {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, body: b}
	if resp.StatusCode >= 400 {
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error.Code == "" {
			t.Fatalf("%s %s: %d without a JSON error body: %s", method, url, resp.StatusCode, b)
		}
		a.code = e.Error.Code
	}
	return a
}

// mountTmpfs mounts a small tmpfs (root only); the test is skipped where it cannot.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	os.MkdirAll(dir, 0o755)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs for a real ENOSPC (needs root): %v %s", err, out)
	}
	t.Cleanup(func() {
		for i := 0; i < 50; i++ {
			if exec.Command("umount", dir).Run() == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("could not unmount %s", dir)
	})
	return dir
}

// fillDisk produces 60 KB messages to topic t until the disk is full; it returns the
// payloads answered 202 (offset i holds payload i).
func fillDisk(t *testing.T, n *node.Node) [][]byte {
	if a := call(t, "POST", n.URL()+"/v1/topics", []byte(`{"name":"t","partitions":1}`)); a.status != 201 {
		t.Fatalf("create: %d %s", a.status, a.body)
	}
	var sent [][]byte
	for i := 0; ; i++ {
		p := bytes.Repeat([]byte{byte(i)}, 60_000)
		a := call(t, "POST", n.URL()+"/v1/topics/t/produce", p)
		if a.status == 202 {
			sent = append(sent, p)
			continue
		}
		if a.status != 503 {
			t.Fatalf("produce on a full disk: %d %s, want 503", a.status, a.body)
		}
		t.Logf("disk full after %d messages: 503 %s", len(sent), a.code)
		return sent
	}
}

// checkAll replays partition 0 and requires exactly the 202'd payloads, in order.
func checkAll(t *testing.T, n *node.Node, sent [][]byte) {
	t.Helper()
	got := 0
	for from := 0; ; {
		a := call(t, "GET", fmt.Sprintf("%s/v1/topics/t/partitions/0/messages?from=%d&max=50&payload_encoding=base64", n.URL(), from), nil)
		if a.status != 200 {
			t.Fatalf("replay: %d %s", a.status, a.body)
		}
		var r struct {
			Messages []struct {
				Offset  int
				Payload []byte
			}
			Next int `json:"next_offset"`
		}
		json.Unmarshal(a.body, &r)
		if len(r.Messages) == 0 {
			break
		}
		for _, m := range r.Messages {
			if m.Offset >= len(sent) {
				t.Fatalf("offset %d is visible, but only %d messages were answered 202", m.Offset, len(sent))
			}
			if !bytes.Equal(m.Payload, sent[m.Offset]) {
				t.Fatalf("offset %d holds other bytes than were sent", m.Offset)
			}
			got++
		}
		from = r.Next
	}
	if got != len(sent) {
		t.Fatalf("replay found %d messages, %d were answered 202", got, len(sent))
	}
}

// TestDiskFull is RELIABILITY.md C20 on a real file system: a tmpfs runs out of space
// under produce. The answer must be a 503 with a JSON error, no partial record may
// become visible, everything answered 202 must stay, writes must resume once space
// returns (without a restart), and everything must still be there after a kill -9.
func TestDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	// 8 MiB of it go to the write-ahead file, 8 MiB more to a spare once the first is
	// half full: the messages fill the rest.
	mnt := mountTmpfs(t, "22m")
	data := filepath.Join(mnt, "data")
	n := startNode(t, data, "--segment-bytes", "1048576")
	sent := fillDisk(t, n)
	checkAll(t, n, sent)
	if out, err := exec.Command("mount", "-o", "remount,size=64m", mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount: %v %s", err, out)
	}
	resumed := false
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && !resumed; {
		p := bytes.Repeat([]byte{byte(len(sent))}, 60_000)
		if a := call(t, "POST", n.URL()+"/v1/topics/t/produce", p); a.status == 202 {
			sent, resumed = append(sent, p), true
		} else {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if !resumed {
		t.Fatal("space came back 20 s ago and produce still fails")
	}
	checkAll(t, n, sent)
	n.Kill()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	checkAll(t, n, sent)
	if a := call(t, "POST", n.URL()+"/v1/topics/t/produce", []byte("after")); a.status != 202 {
		t.Fatalf("produce after a restart with space back: %d %s", a.status, a.body)
	}
}
