package runner

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMatch(t *testing.T) {
	cases := []struct {
		exp, act any
		ok       bool
	}{
		{map[string]any{"a": 1}, map[string]any{"a": 1.0, "b": 2}, true},
		{map[string]any{"a": 1}, map[string]any{"a": 2}, false},
		{map[string]any{"a": map[string]any{"$absent": true}}, map[string]any{"b": 1}, true},
		{map[string]any{"a": map[string]any{"$absent": true}}, map[string]any{"a": nil}, true},
		{map[string]any{"a": map[string]any{"$absent": true}}, map[string]any{"a": 1}, false},
		{[]any{1, 2}, []any{1.0, 2.0}, true},
		{[]any{1, 2}, []any{1.0, 2.0, 3.0}, false},
		{"~^ab+c$", "abbbc", true},
		{"~^ab+c$", "ac", false},
		{map[string]any{"$len": 2}, []any{"x", "y"}, true},
		{map[string]any{"$len": map[string]any{"$lte": 3}}, []any{1, 2, 3}, true},
		{map[string]any{"$len": map[string]any{"$lte": 3}}, []any{1, 2, 3, 4}, false}, // was never checked: any length failed
		{map[string]any{"$len": "3"}, []any{1, 2, 3}, false},
		{map[string]any{"$gte": 3}, 3, true},
		{map[string]any{"$lt": 3}, 3, false},
		{map[string]any{"$contains": []any{map[string]any{"k": "b"}}}, []any{map[string]any{"k": "a"}, map[string]any{"k": "b"}}, true},
		{map[string]any{"$contains": []any{map[string]any{"k": "c"}}}, []any{map[string]any{"k": "a"}}, false},
		{map[string]any{"$oneof": []any{"x", "y"}}, "y", true},
		{map[string]any{"$not": map[string]any{"$len": 0}}, []any{}, false},
		{map[string]any{"$any": true}, nil, true},
		{"1", 1, false},
	}
	for i, c := range cases {
		err := Match(c.exp, c.act)
		if (err == nil) != c.ok {
			t.Errorf("case %d: Match(%v, %v) = %v, want ok=%v", i, show(c.exp), show(c.act), err, c.ok)
		}
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]any{"t": "topic.x", "r": map[string]any{"messages": []any{map[string]any{"id": "m1", "offset": 7.0}}}}
	got, err := Expand(map[string]any{"msg": "${r.messages.0.id}", "off": "${r.messages.0.offset}", "path": "/v1/topics/${t}/ack"}, vars)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"msg": "m1", "off": 7.0, "path": "/v1/topics/topic.x/ack"}
	if err := Match(want, got); err != nil {
		t.Fatal(err)
	}
	if _, err := Expand("${nope}", vars); err == nil {
		t.Fatal("an unknown variable must be an error")
	}
}

// The fake driver below lacks every capability but produce, and produces wrongly:
// bytes go as text/plain. The suite must call the first scenario n/a, never pass,
// and fail the second.
func TestFakeDriverIsHeldToTheRules(t *testing.T) {
	if os.Getenv("CONFORMANCE_FAKE_DRIVER") == "1" {
		t.Skip("running as the fake driver")
	}
	scs, err := LoadScenarios("../scenarios")
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*Scenario{}
	for _, sc := range scs {
		byName[sc.Name] = sc
	}
	t.Setenv("CONFORMANCE_FAKE_DRIVER", "1")
	spec := DriverSpec{Name: "fake", Argv: []string{os.Args[0], "-test.run=^TestFakeDriverMain$"}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res := RunScenario(ctx, byName["wire-consumer-free-workers"], spec, Env{})
	if res.Outcome != NA || !strings.Contains(res.Reason, "consume") {
		t.Errorf("a scenario needing consume: got %s (%s), want n/a", res.Outcome, res.Reason)
	}
	res = RunScenario(ctx, byName["wire-produce-request"], spec, Env{})
	if res.Outcome != Fail || !strings.Contains(res.Reason, "content-type") {
		t.Errorf("a driver sending bytes as text: got %s (%s), want a failure on content-type", res.Outcome, res.Reason)
	}
	res = RunScenario(ctx, byName["behaviour-roundtrip-bodies"], spec, Env{})
	if res.Outcome != NA {
		t.Errorf("a behaviour scenario without a broker: got %s, want n/a", res.Outcome)
	}
}

func TestFakeDriverMain(t *testing.T) {
	if os.Getenv("CONFORMANCE_FAKE_DRIVER") != "1" {
		t.Skip("only run as the fake driver")
	}
	var endpoint, user, pass string
	out := json.NewEncoder(os.Stdout)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var req struct {
			ID   int            `json:"id"`
			Cmd  string         `json:"cmd"`
			Args map[string]any `json:"args"`
		}
		if json.Unmarshal(in.Bytes(), &req) != nil {
			continue
		}
		reply := map[string]any{"id": req.ID, "ok": true, "result": map[string]any{}}
		switch req.Cmd {
		case "hello":
			reply["result"] = map[string]any{"name": "fake", "version": "0", "language": "go", "capabilities": []string{"produce"}}
		case "client.new":
			eps, _ := req.Args["endpoints"].([]any)
			if len(eps) > 0 {
				endpoint, _ = eps[0].(string)
			}
			if a, ok := req.Args["auth"].(map[string]any); ok {
				user, _ = a["username"].(string)
				pass, _ = a["password"].(string)
			}
		case "produce":
			body, _ := req.Args["body"].(map[string]any)
			var data []byte
			if s, ok := body["b64"].(string); ok {
				data, _ = base64.StdEncoding.DecodeString(s)
			} else {
				data = []byte(body["text"].(string))
			}
			hreq, _ := http.NewRequest(http.MethodPost, endpoint+"/v1/topics/"+req.Args["topic"].(string)+"/produce", bytes.NewReader(data))
			hreq.Header.Set("Content-Type", "text/plain")
			hreq.SetBasicAuth(user, pass)
			resp, err := http.DefaultClient.Do(hreq)
			if err == nil {
				resp.Body.Close()
			}
			reply["result"] = map[string]any{"topic": req.Args["topic"], "partition": 0, "offset": 0}
		case "exit":
			_ = out.Encode(reply)
			os.Exit(0)
		default:
			reply = map[string]any{"id": req.ID, "ok": false, "error": map[string]any{"kind": "Unsupported"}}
		}
		_ = out.Encode(reply)
	}
	os.Exit(0)
}
