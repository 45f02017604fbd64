package runner

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// DriverSpec says how to start one SDK's driver: a name (go, python, js, or a third
// party's) and the command line.
type DriverSpec struct {
	Name string
	Argv []string
	Dir  string
}

// Hello is the driver's answer to the handshake.
type Hello struct {
	Name         string   `json:"name"`
	Version      string   `json:"version"`
	Language     string   `json:"language"`
	Capabilities []string `json:"capabilities"`
}

// Has reports whether the driver declared capability c.
func (h Hello) Has(c string) bool {
	for _, x := range h.Capabilities {
		if x == c {
			return true
		}
	}
	return false
}

// Response is a driver's answer to one command.
type Response struct {
	ID     int            `json:"id"`
	OK     bool           `json:"ok"`
	Result any            `json:"result"`
	Error  map[string]any `json:"error"`
}

// Event is something a driver reported on its own (a handler ran, a message settled).
type Event struct {
	Name string         `json:"event"`
	Data map[string]any `json:"data"`
	At   time.Time      `json:"-"`
}

// Driver is one running driver process speaking JSON Lines over stdin and stdout.
type Driver struct {
	Spec  DriverSpec
	Hello Hello

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	wmu    sync.Mutex
	stderr *capBuffer
	exited chan struct{}

	mu      sync.Mutex
	nextID  int
	pending map[int]chan Response
	events  []Event
	changed chan struct{} // closed and replaced whenever an event arrives
	readErr error
}

// StartDriver starts the driver and does the hello handshake.
func StartDriver(ctx context.Context, spec DriverSpec) (*Driver, error) {
	if len(spec.Argv) == 0 {
		return nil, fmt.Errorf("driver %s: no command", spec.Name)
	}
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Dir = spec.Dir
	cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	d := &Driver{Spec: spec, cmd: cmd, stderr: &capBuffer{max: 64 << 10}, exited: make(chan struct{}),
		pending: map[int]chan Response{}, changed: make(chan struct{})}
	cmd.Stderr = d.stderr
	var err error
	if d.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("driver %s: %w", spec.Name, err)
	}
	go d.read(out)
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := d.Call(hctx, "hello", map[string]any{"protocol": 1})
	if err != nil {
		d.Stop()
		return nil, fmt.Errorf("driver %s: hello: %w; stderr: %s", spec.Name, err, d.Stderr())
	}
	if !r.OK {
		d.Stop()
		return nil, fmt.Errorf("driver %s: hello failed: %v", spec.Name, r.Error)
	}
	b, _ := json.Marshal(r.Result)
	if err := json.Unmarshal(b, &d.Hello); err != nil {
		d.Stop()
		return nil, fmt.Errorf("driver %s: hello: %w", spec.Name, err)
	}
	return d, nil
}

func (d *Driver) read(out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var probe struct {
			ID    *int   `json:"id"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &probe); err != nil {
			_, _ = d.stderr.Write([]byte("runner: not a JSON line from the driver: " + string(line) + "\n")) // diagnostics only
			continue
		}
		if probe.Event != "" {
			var ev Event
			dec := json.NewDecoder(bytes.NewReader(line))
			dec.UseNumber()
			if err := dec.Decode(&ev); err == nil {
				ev.Data, _ = decorate(normalize(ev.Data)).(map[string]any)
				if ev.Data == nil {
					ev.Data = map[string]any{}
				}
				ev.At = time.Now()
				d.mu.Lock()
				d.events = append(d.events, ev)
				close(d.changed)
				d.changed = make(chan struct{})
				d.mu.Unlock()
			}
			continue
		}
		if probe.ID == nil {
			continue
		}
		var r Response
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.UseNumber()
		if err := dec.Decode(&r); err != nil {
			continue
		}
		r.Result = decorate(normalize(r.Result))
		if r.Error != nil {
			r.Error, _ = normalize(r.Error).(map[string]any)
		}
		d.mu.Lock()
		ch := d.pending[r.ID]
		delete(d.pending, r.ID)
		d.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	d.mu.Lock()
	d.readErr = errors.New("the driver closed its stdout")
	for id, ch := range d.pending {
		close(ch)
		delete(d.pending, id)
	}
	close(d.changed)
	d.changed = make(chan struct{})
	d.mu.Unlock()
	_ = d.cmd.Wait()
	close(d.exited)
}

// Send writes one command and returns a channel that gets its response.
func (d *Driver) Send(cmd string, args any) (int, <-chan Response, error) {
	d.mu.Lock()
	if d.readErr != nil {
		d.mu.Unlock()
		return 0, nil, d.readErr
	}
	d.nextID++
	id := d.nextID
	ch := make(chan Response, 1)
	d.pending[id] = ch
	d.mu.Unlock()
	line, err := json.Marshal(map[string]any{"id": id, "cmd": cmd, "args": args})
	if err != nil {
		return 0, nil, err
	}
	d.wmu.Lock()
	_, err = d.stdin.Write(append(line, '\n'))
	d.wmu.Unlock()
	if err != nil {
		return 0, nil, fmt.Errorf("writing to the driver: %w", err)
	}
	return id, ch, nil
}

// Call sends one command and waits for its response.
func (d *Driver) Call(ctx context.Context, cmd string, args any) (Response, error) {
	_, ch, err := d.Send(cmd, args)
	if err != nil {
		return Response{}, err
	}
	return d.Await(ctx, ch)
}

// Await waits for a response sent earlier.
func (d *Driver) Await(ctx context.Context, ch <-chan Response) (Response, error) {
	select {
	case r, ok := <-ch:
		if !ok {
			return Response{}, fmt.Errorf("the driver exited; stderr: %s", d.Stderr())
		}
		return r, nil
	case <-ctx.Done():
		return Response{}, fmt.Errorf("no answer from the driver: %w", ctx.Err())
	}
}

// Events returns a copy of the events so far and a channel closed at the next one.
func (d *Driver) Events() ([]Event, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Event(nil), d.events...), d.changed
}

// Stderr returns the tail of what the driver wrote to stderr.
func (d *Driver) Stderr() string { return d.stderr.String() }

// Stop asks the driver to exit, then kills it if it does not.
func (d *Driver) Stop() {
	if d.cmd.Process == nil {
		return
	}
	select {
	case <-d.exited:
		return
	default:
	}
	_, _, _ = d.Send("exit", map[string]any{})
	_ = d.stdin.Close()
	select {
	case <-d.exited:
	case <-time.After(5 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// decorate adds body_text beside every body_b64 that decodes to UTF-8, so scenarios
// can say what they expect in text.
func decorate(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = decorate(e)
		}
		if s, ok := x["body_b64"].(string); ok {
			if b, err := base64.StdEncoding.DecodeString(s); err == nil && utf8.Valid(b) {
				x["body_text"] = string(b)
			}
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = decorate(e)
		}
	}
	return v
}

type capBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (c *capBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(c.buf, p...)
	if len(c.buf) > c.max {
		c.buf = append([]byte("…"), c.buf[len(c.buf)-c.max:]...)
	}
	return len(p), nil
}

func (c *capBuffer) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.TrimSpace(string(c.buf))
}
