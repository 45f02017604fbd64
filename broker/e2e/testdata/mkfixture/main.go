// Command mkfixture makes a data-directory fixture for TestFormatFixtures: it starts the
// narad binary it is given on a new data directory, fills it through the HTTP API with
// the content the test expects (see broker/e2e/testdata/README.md), stops it with
// SIGTERM and writes the directory as a .tar.gz.
//
// It is a program, not a test, because a fixture must be made by the binary of the
// format it preserves, which for every format but the newest is an old build:
//
//	go run ./e2e/testdata/mkfixture -narad /path/to/old/narad -out e2e/testdata/format-N.tar.gz
//
// It uses only the API that every version since format 1 serves.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// AdminPassword is the password of the fixtures' admin user.
const AdminPassword = "admin-secret-1"

func main() {
	bin := flag.String("narad", "", "the narad binary to make the fixture with")
	out := flag.String("out", "", "the .tar.gz to write")
	flag.Parse()
	if *bin == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: mkfixture -narad <binary> -out <file.tar.gz>")
		os.Exit(2)
	}
	if err := run(*bin, *out); err != nil {
		fmt.Fprintln(os.Stderr, "mkfixture:", err)
		os.Exit(1)
	}
}

func run(bin, out string) error {
	dir, err := os.MkdirTemp("", "narad-fixture-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	data := filepath.Join(dir, "data")
	port, err := freePort()
	if err != nil {
		return err
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, "serve", "--http-addr", "127.0.0.1:"+strconv.Itoa(port), "--data-dir", data)
	cmd.Env = append(os.Environ(), "NARAD_ADMIN_PASSWORD="+AdminPassword)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	c := &client{base: base, user: "admin", pass: AdminPassword}
	if err := waitFor(60*time.Second, "the broker to be ready", func() (bool, error) {
		code, _, err := c.do("GET", "/readyz", nil, "")
		return err == nil && code == 200, nil
	}); err != nil {
		return err
	}
	if err := fill(c); err != nil {
		return err
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	stopped = true
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("narad did not stop cleanly: %w", err)
	}
	return writeTarGz(data, out)
}

// fill makes the fixture's content. TestFormatFixtures (broker/e2e/format_test.go)
// checks every item; change both together.
func fill(c *client) error {
	steps := []struct {
		method, path string
		body         any
		want         int
	}{
		{"POST", "/v1/users", map[string]any{"username": "alice", "password": "alice-password", "grants": []any{
			map[string]any{"action": "produce", "topics": []string{"orders"}},
			map[string]any{"action": "consume", "topics": []string{"orders", "orders.copy", "orders.later"}},
		}}, 201},
		{"POST", "/v1/users", map[string]any{"username": "bob", "password": "bob-password", "grants": []any{
			map[string]any{"action": "create", "topics": []string{"bob.*"}},
			map[string]any{"action": "consume", "topics": []string{"plain"}},
		}}, 201},
		{"POST", "/v1/topics", map[string]any{"name": "orders", "partitions": 2}, 201},
		{"POST", "/v1/topics", map[string]any{"name": "orders.copy", "partitions": 2}, 201},
		{"POST", "/v1/topics/orders/children", map[string]any{"child": "orders.copy"}, 201},
		{"POST", "/v1/topics", map[string]any{"name": "orders.later", "partitions": 1, "parent": "orders", "fanout_delay_ms": 1000}, 201},
		{"POST", "/v1/topics", map[string]any{"name": "plain", "partitions": 1, "visibility_timeout_ms": 600000}, 201},
		{"POST", "/v1/topics", map[string]any{"name": "raw", "partitions": 1}, 201},
		{"POST", "/v1/topics", map[string]any{"name": "events", "partitions": 1, "schema": map[string]any{
			"type": "object", "required": []string{"id"},
		}}, 201},
	}
	for _, s := range steps {
		if err := c.expect(s.method, s.path, s.body, s.want); err != nil {
			return err
		}
	}
	bob := &client{base: c.base, user: "bob", pass: "bob-password"}
	if err := bob.expect("POST", "/v1/topics", map[string]any{"name": "bob.t", "partitions": 1}, 201); err != nil {
		return err
	}
	for i := 0; i < 10; i++ {
		if err := c.expect("POST", "/v1/topics/orders/produce?key=k"+strconv.Itoa(i%3), map[string]any{"id": "o" + strconv.Itoa(i)}, 202); err != nil {
			return err
		}
	}
	for i := 0; i < 5; i++ {
		if err := c.expect("POST", "/v1/topics/plain/produce", map[string]any{"id": "p" + strconv.Itoa(i)}, 202); err != nil {
			return err
		}
	}
	if err := c.expect("POST", "/v1/topics/events/produce", map[string]any{"id": "e0"}, 202); err != nil {
		return err
	}
	for _, body := range [][]byte{{0, 1, 2, 0xff}, []byte("raw-1")} {
		code, resp, err := c.do("POST", "/v1/topics/raw/produce", body, "application/octet-stream")
		if err != nil {
			return err
		}
		if code != 202 {
			return fmt.Errorf("produce to raw: %d %s", code, resp)
		}
	}

	// plain: p0 and p1 acked, p2 leased and never settled, p3 acked ahead of it, p4 not
	// taken. After a restart consumers get p2 and p4, nothing else.
	for i := 0; i < 4; i++ {
		var m struct {
			Payload       struct{ ID string } `json:"payload"`
			ReceiptHandle string              `json:"receipt_handle"`
		}
		if err := c.getJSON("/v1/topics/plain/consume", &m); err != nil {
			return err
		}
		if want := "p" + strconv.Itoa(i); m.Payload.ID != want {
			return fmt.Errorf("plain: consumed %q, want %q", m.Payload.ID, want)
		}
		if i == 2 {
			continue
		}
		if err := c.expect("POST", "/v1/topics/plain/ack?receipt_handle="+m.ReceiptHandle, nil, 204); err != nil {
			return err
		}
	}

	// The children copy every message; orders.copy is then drained, so after a restart
	// it holds nothing until the parent gets more. orders.later keeps its copies.
	for _, child := range []string{"orders.copy", "orders.later"} {
		if err := waitFor(60*time.Second, child+" to catch up", func() (bool, error) { return caughtUp(c, child) }); err != nil {
			return err
		}
	}
	n := 0
	for {
		code, body, err := c.do("GET", "/v1/topics/orders.copy/consume-batch?max=100&wait=1s", nil, "")
		if err != nil {
			return err
		}
		if code == 204 {
			break
		}
		var l struct {
			Messages []struct {
				ReceiptHandle string `json:"receipt_handle"`
			} `json:"messages"`
		}
		if code != 200 || json.Unmarshal(body, &l) != nil {
			return fmt.Errorf("consume-batch orders.copy: %d %s", code, body)
		}
		for _, m := range l.Messages {
			if err := c.expect("POST", "/v1/topics/orders.copy/ack?receipt_handle="+m.ReceiptHandle, nil, 204); err != nil {
				return err
			}
			n++
		}
	}
	if n != 10 {
		return fmt.Errorf("drained %d messages from orders.copy, want 10", n)
	}
	return nil
}

// caughtUp reports whether the child has copied every message of orders.
func caughtUp(c *client, child string) (bool, error) {
	var l struct {
		Children []struct {
			Child string `json:"child"`
			Lag   []struct {
				Lag int64 `json:"lag"`
			} `json:"lag"`
		} `json:"children"`
	}
	if err := c.getJSON("/v1/topics/orders/children", &l); err != nil {
		return false, err
	}
	for _, ch := range l.Children {
		if ch.Child != child {
			continue
		}
		for _, p := range ch.Lag {
			if p.Lag != 0 {
				return false, nil
			}
		}
		return true, nil
	}
	return false, fmt.Errorf("%s is not a child of orders", child)
}

type client struct{ base, user, pass string }

func (c *client) do(method, path string, body []byte, contentType string) (int, []byte, error) {
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.SetBasicAuth(c.user, c.pass)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func (c *client) expect(method, path string, v any, want int) error {
	var body []byte
	ct := ""
	if v != nil {
		var err error
		if body, err = json.Marshal(v); err != nil {
			return err
		}
		ct = "application/json"
	}
	code, resp, err := c.do(method, path, body, ct)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if code != want {
		return fmt.Errorf("%s %s: status %d, want %d: %s", method, path, code, want, resp)
	}
	return nil
}

func (c *client) getJSON(path string, v any) error {
	code, body, err := c.do("GET", path, nil, "")
	if err != nil {
		return err
	}
	if code != 200 {
		return fmt.Errorf("GET %s: status %d: %s", path, code, body)
	}
	return json.Unmarshal(body, v)
}

func waitFor(d time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("timed out waiting for %s", what)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// writeTarGz writes dir's files in name order with their modes and no owners or times,
// so the same directory gives the same archive.
func writeTarGz(dir, out string) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, p := range paths {
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: "./" + filepath.ToSlash(rel), Mode: int64(info.Mode().Perm()), ModTime: time.Unix(0, 0)}
		switch {
		case info.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case info.Mode().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, info.Size()
		default:
			return errors.New("unexpected file type: " + p)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if _, err := tw.Write(b); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}
