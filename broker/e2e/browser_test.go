package e2e

import (
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// browserCall is a request as a web page's script or form would send it.
type browserCall struct {
	name, method, path, body string
	host                     string   // the Host header; empty: the broker's own
	hdr                      []string // name, value pairs
}

func (bc browserCall) send(t *testing.T, c *testutil.Client) *testutil.Response {
	t.Helper()
	req, err := http.NewRequest(bc.method, c.BaseURL()+bc.path, strings.NewReader(bc.body))
	if err != nil {
		t.Fatal(err)
	}
	if bc.host != "" {
		req.Host = bc.host
	}
	for i := 0; i+1 < len(bc.hdr); i += 2 {
		req.Header.Set(bc.hdr[i], bc.hdr[i+1])
	}
	r, err := c.Send(req)
	if err != nil {
		t.Fatalf("%s: %v", bc.name, err)
	}
	return r
}

// TestBrowserRequestsRefusedWithoutAuth: with security off (the default on loopback),
// a web page the developer visits must not reach the broker: a cross-site request that
// would change state (consume included: it takes a lease) is refused, and so is any
// request whose Host is a name other than loopback's (DNS rebinding), while the
// broker's own clients and same-origin pages are served.
func TestBrowserRequestsRefusedWithoutAuth(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t)
	a.createTopic("t", map[string]any{"partitions": 1})
	a.produceJSON("t", map[string]any{"id": "0"}, "")
	before := snapshot(a)
	self := strings.TrimPrefix(n.URL(), "http://")
	port := self[strings.LastIndexByte(self, ':')+1:]
	evil := []string{"Origin", "http://evil.example"}
	plain := []string{"Content-Type", "text/plain", "Origin", "http://evil.example"}
	refused := []browserCall{
		{name: "create topic cross-site", method: "POST", path: "/v1/topics", body: `{"name":"pwned"}`, hdr: plain},
		{name: "produce cross-site", method: "POST", path: "/v1/topics/t/produce", body: `{"a":1}`, hdr: plain},
		{name: "produce-batch cross-site", method: "POST", path: "/v1/topics/t/produce-batch", body: `{"messages":[{"payload":1}]}`, hdr: plain},
		{name: "delete topic cross-site", method: "DELETE", path: "/v1/topics/t", hdr: evil},
		{name: "alter topic cross-site", method: "PATCH", path: "/v1/topics/t", body: `{"visibility_timeout_ms":5000}`, hdr: plain},
		{name: "consume cross-site (fetch metadata only)", method: "GET", path: "/v1/topics/t/consume", hdr: []string{"Sec-Fetch-Site", "cross-site"}},
		{name: "consume-batch cross-site", method: "GET", path: "/v1/topics/t/consume-batch", hdr: evil},
		{name: "produce from an opaque origin", method: "POST", path: "/v1/topics/t/produce", body: "x", hdr: []string{"Origin", "null"}},
		{name: "produce from another port of loopback", method: "POST", path: "/v1/topics/t/produce", body: "x", hdr: []string{"Origin", "http://127.0.0.1:1"}},
		// A page on another port of loopback (or another subdomain) is the same site, not
		// the same origin: its <img> or no-cors fetch of consume sends no Origin.
		{name: "consume from another port of loopback (fetch metadata only)", method: "GET", path: "/v1/topics/t/consume", hdr: []string{"Sec-Fetch-Site", "same-site"}},
		{name: "consume-batch from a sibling subdomain (fetch metadata only)", method: "GET", path: "/v1/topics/t/consume-batch", hdr: []string{"Sec-Fetch-Site", "same-site"}},
		{name: "produce, DNS rebinding", method: "POST", path: "/v1/topics/t/produce", body: "x", host: "evil.example:" + port, hdr: []string{"Origin", "http://evil.example:" + port}},
		{name: "list topics, DNS rebinding", method: "GET", path: "/v1/topics", host: "evil.example:" + port},
		{name: "consume, DNS rebinding", method: "GET", path: "/v1/topics/t/consume", host: "rebind.evil.example"},
	}
	for _, bc := range refused {
		r := bc.send(t, a.Client)
		if r.Status != http.StatusForbidden || r.ErrorCode() != "forbidden" {
			t.Errorf("%s: %d %s, want 403 forbidden", bc.name, r.Status, r.Body)
			continue
		}
		want := "serve the page from the broker's own origin"
		if bc.host != "" {
			want = "--allowed-hosts"
		}
		if !strings.Contains(string(r.Body), want) {
			t.Errorf("%s: the message %s does not say what to do (%q)", bc.name, r.Body, want)
		}
	}
	if after := snapshot(a); !reflect.DeepEqual(before, after) {
		t.Errorf("refused requests changed the broker:\nbefore %+v\nafter  %+v", before, after)
	}
	served := []browserCall{
		{name: "same-origin page", method: "POST", path: "/v1/topics/t/produce", body: "x", hdr: []string{"Origin", "http://" + self, "Sec-Fetch-Site", "same-origin"}},
		{name: "a URL the user typed", method: "GET", path: "/v1/topics/t/consume?wait=0", hdr: []string{"Sec-Fetch-Site", "none"}},
		{name: "localhost name", method: "POST", path: "/v1/topics/t/produce", body: "x", host: "localhost:" + port},
		{name: "a .localhost name", method: "POST", path: "/v1/topics/t/produce", body: "x", host: "app.localhost:" + port},
		{name: "an IP address", method: "GET", path: "/v1/topics", host: "10.1.2.3:" + port},
		{name: "a cross-site read", method: "GET", path: "/v1/topics/t", hdr: evil},
		{name: "health, any host", method: "GET", path: "/healthz", host: "probe.example"},
	}
	for _, bc := range served {
		if r := bc.send(t, a.Client); r.Status >= 300 {
			t.Errorf("%s: %d %s, want it served", bc.name, r.Status, r.Body)
		}
	}
}

// TestAllowedHosts: --allowed-hosts names the hosts a broker without security serves
// besides loopback names and IP addresses; a leading dot allows subdomains.
func TestAllowedHosts(t *testing.T) {
	t.Parallel()
	n, a := startBroker(t, "--allowed-hosts", "narad.internal,.svc.example")
	self := strings.TrimPrefix(n.URL(), "http://")
	port := self[strings.LastIndexByte(self, ':')+1:]
	for host, want := range map[string]int{
		"narad.internal:" + port:     http.StatusOK,
		"NARAD.internal":             http.StatusOK,
		"broker.svc.example:" + port: http.StatusOK,
		"svc.example.evil:" + port:   http.StatusForbidden,
		"other.internal:" + port:     http.StatusForbidden,
	} {
		bc := browserCall{name: host, method: "GET", path: "/v1/topics", host: host}
		if r := bc.send(t, a.Client); r.Status != want {
			t.Errorf("GET /v1/topics with Host %s: %d %s, want %d", host, r.Status, r.Body, want)
		}
	}
}

// TestBrowserRulesWithAuth: with security on, credentials decide and any Host name is
// served, but a cross-site request that changes state is still refused: a browser
// attaches cached Basic credentials to a forged cross-site form post, so the
// credentials alone do not show that their holder meant it.
func TestBrowserRulesWithAuth(t *testing.T) {
	t.Parallel()
	_, admin := startSecured(t)
	admin.createTopic("t", map[string]any{"partitions": 1})
	own := browserCall{name: "produce with credentials under another Host", method: "POST", path: "/v1/topics/t/produce", body: "x", host: "broker.example.com"}
	if r := own.send(t, admin.Client); r.Status != http.StatusAccepted {
		t.Errorf("%s: %d %s, want 202", own.name, r.Status, r.Body)
	}
	for _, bc := range []browserCall{
		{name: "cross-site produce with credentials", method: "POST", path: "/v1/topics/t/produce", body: "x", hdr: []string{"Origin", "https://evil.example"}},
		{name: "cross-site form post (Sec-Fetch-Site)", method: "POST", path: "/v1/topics/t/produce", body: "x", hdr: []string{"Sec-Fetch-Site", "cross-site", "Content-Type", "text/plain"}},
		{name: "cross-site consume with credentials", method: "GET", path: "/v1/topics/t/consume", hdr: []string{"Origin", "null"}},
		{name: "same-site consume with credentials (no Origin)", method: "GET", path: "/v1/topics/t/consume", hdr: []string{"Sec-Fetch-Site", "same-site"}},
		{name: "cross-site delete with credentials", method: "DELETE", path: "/v1/topics/t", hdr: []string{"Origin", "https://evil.example"}},
	} {
		bc.send(t, admin.Client).ExpectError(t, http.StatusForbidden, "forbidden")
	}
	// Nothing reached the topic: the one message is still there, unconsumed.
	var topic struct {
		PartitionStats []struct {
			HighWatermark uint64 `json:"high_watermark"`
			InFlight      int    `json:"in_flight"`
		} `json:"partition_stats"`
	}
	admin.Get("/v1/topics/t").JSON(t, &topic)
	if len(topic.PartitionStats) != 1 || topic.PartitionStats[0].HighWatermark != 1 || topic.PartitionStats[0].InFlight != 0 {
		t.Errorf("after refused cross-site requests: %+v, want one message, none in flight", topic.PartitionStats)
	}
	// Reads carry no change, so a page may still read what its user may read (the
	// browser keeps the answer from a page of another origin without CORS headers).
	bc := browserCall{name: "cross-site list", method: "GET", path: "/v1/topics", hdr: []string{"Origin", "https://evil.example"}}
	if r := bc.send(t, admin.Client); r.Status != http.StatusOK {
		t.Errorf("%s: %d %s, want 200", bc.name, r.Status, r.Body)
	}
}
