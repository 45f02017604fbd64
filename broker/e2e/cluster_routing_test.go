package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The routing tests: any node serves any request, forwarding a partition's operations
// to the node that holds it over the node plane (cluster part 2).

// placed creates topic name with one partition per node on nodes[0] and waits until
// every node has it; it returns, per partition, the node that holds it. The topic has
// one replica per partition unless settings say otherwise: these tests are about
// forwarding to the one node that holds a partition.
func placed(t *testing.T, nodes []*clusterNode, name string, settings map[string]any) []*clusterNode {
	t.Helper()
	if _, ok := settings["replication_factor"]; !ok {
		settings["replication_factor"] = 1
	}
	nodes[0].api.createTopic(name, settings)
	var holders []*clusterNode
	waitFor(t, 30*time.Second, "every node to list "+name+" with its placement", func() bool {
		holders = nil
		for _, nd := range nodes {
			r, err := nd.api.Try(http.MethodGet, topicPath(name), nil)
			if err != nil || r.Status != http.StatusOK {
				return false
			}
			var d topicDetail
			if json.Unmarshal(r.Body, &d) != nil {
				return false
			}
			var hs []*clusterNode
			for _, ps := range d.PartitionStats {
				for _, o := range nodes {
					if o.id == ps.Leader {
						hs = append(hs, o)
					}
				}
			}
			if len(hs) != len(d.PartitionStats) || len(hs) == 0 {
				return false
			}
			holders = hs
		}
		return true
	})
	return holders
}

// TestClusterAnyNodeServes: a topic created through one node is usable at once through
// the others; on a 3-node cluster with one partition on each node, every
// data route sent to every node answers as a single node does: produce to each
// partition through each node, replay of each partition on each node, a consume on one
// node that collects the messages of every partition, acks of those leases on other
// nodes, batches that span partitions, a second ack answering lease_lost anywhere, and
// fan-out from a parent to a child whose partitions live on other nodes.
func TestClusterAnyNodeServes(t *testing.T) {
	t.Parallel()
	nodes := startPeersCluster(t, 3)
	agreed(t, wantMembers(nodes...), nodes...)
	// A topic created through one node is there at once on the others: each catches
	// up with the controller before it would answer that a topic does not exist.
	for i := range 3 {
		name := "fresh" + strconv.Itoa(i)
		nodes[i].api.createTopic(name, map[string]any{"partitions": 3})
		for _, nd := range others(nodes, nodes[i]) {
			nd.api.produce(name, []byte(`{"fresh":1}`), "application/json", "")
		}
	}
	holders := placed(t, nodes, "routed", map[string]any{"partitions": 3})
	spread := map[string]bool{}
	for _, h := range holders {
		spread[h.id] = true
	}
	if len(spread) != 3 {
		t.Fatalf("the 3 partitions are placed on %v; want one on each node", spread)
	}

	// Produce to every partition through every node.
	want := map[string]bool{}
	for i, nd := range nodes {
		for p := range 3 {
			body := fmt.Sprintf(`{"from":%d,"to":%d}`, i, p)
			got := nd.api.produce("routed", []byte(body), "application/json", "partition="+strconv.Itoa(p))
			if int(got.Partition) != p {
				t.Fatalf("produce via %s to partition %d stored in partition %d", nd.id, p, got.Partition)
			}
			want[body] = true
		}
	}
	// A batch that spans the partitions, through one node.
	batch := nodes[1].api.Do(http.MethodPost, topicPath("routed")+"/produce-batch",
		[]byte(`{"messages":[{"partition":0,"payload":{"b":0}},{"partition":1,"payload":{"b":1}},{"partition":2,"payload":{"b":2}}]}`),
		"Content-Type", "application/json")
	batch.Expect(t, http.StatusAccepted)
	for p := range 3 {
		want[fmt.Sprintf(`{"b":%d}`, p)] = true
	}

	// Replay of every partition is the same on every node.
	var first [3]string
	for i, nd := range nodes {
		for p := range 3 {
			var offs []string
			for _, m := range nd.api.readAll("routed", p) {
				offs = append(offs, strconv.FormatInt(m.Offset, 10)+"="+string(m.Payload))
			}
			s := strings.Join(offs, " ")
			if len(offs) != 4 {
				t.Fatalf("replay of partition %d on %s: %d messages (%s), want 4", p, nd.id, len(offs), s)
			}
			if i == 0 {
				first[p] = s
			} else if s != first[p] {
				t.Fatalf("replay of partition %d differs: %s on %s, %s on %s", p, first[p], nodes[0].id, s, nd.id)
			}
		}
	}

	// One node's consumes collect every partition's messages; acks go to the others.
	got := map[string]bool{}
	parts := map[int32]int{}
	var leased []message
	deadline := time.Now().Add(30 * time.Second)
	for len(leased) < len(want) && time.Now().Before(deadline) {
		for _, m := range nodes[2].api.consumeBatch("routed", 5, "1s") {
			if got[string(m.Payload)] {
				t.Fatalf("message %s delivered twice", m.Payload)
			}
			got[string(m.Payload)] = true
			parts[m.Partition]++
			leased = append(leased, m)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("consumed %d distinct messages via %s, want %d", len(got), nodes[2].id, len(want))
	}
	if len(parts) != 3 {
		t.Fatalf("consumes on one node served partitions %v; want all three", parts)
	}
	for i, m := range leased[:len(leased)-3] {
		nodes[i%3].api.mustAck("routed", &m)
	}
	// The last three in one ack-batch through one node: they span partitions.
	var handles []string
	for _, m := range leased[len(leased)-3:] {
		handles = append(handles, `{"receipt_handle":"`+m.ReceiptHandle+`"}`)
	}
	r := nodes[0].api.Do(http.MethodPost, topicPath("routed")+"/ack-batch",
		[]byte(`{"acks":[`+strings.Join(handles, ",")+`]}`), "Content-Type", "application/json")
	var res struct {
		Results []ackResult `json:"results"`
	}
	if r.Expect(t, http.StatusOK) {
		r.JSON(t, &res)
	}
	for _, a := range res.Results {
		if a.Status != http.StatusNoContent {
			t.Fatalf("ack-batch item %s: %d %+v", a.ReceiptHandle, a.Status, a.Error)
		}
	}
	// Settled everywhere: nothing is left, and a second ack is lease_lost on any node.
	for _, nd := range nodes {
		if m := nd.api.consume("routed", "wait=0"); m != nil {
			t.Fatalf("%s delivered %s after every message was acked", nd.id, m.Payload)
		}
		r := nd.api.ack("routed", leased[0].ReceiptHandle, "")
		r.Expect(t, http.StatusGone)
		if !strings.Contains(string(r.Body), `"lease_lost"`) {
			t.Fatalf("second ack on %s: %s, want lease_lost", nd.id, r.Body)
		}
	}
	// The partitions' counters are the same on every node.
	for _, nd := range nodes {
		d := nd.api.topic("routed")
		for _, ps := range d.PartitionStats {
			if ps.Backlog != 0 || ps.InFlight != 0 {
				t.Fatalf("%s reports partition %d backlog %d, in flight %d after every ack", nd.id, ps.Partition, ps.Backlog, ps.InFlight)
			}
		}
	}
	// Big batches cross the node plane whole: a produce-batch of 4.5 MiB to a partition
	// another node holds, and a consume-batch that brings it back through a third.
	big := placed(t, nodes, "big", map[string]any{"partitions": 1})
	var via, back *clusterNode
	for _, nd := range nodes {
		if nd != big[0] && via == nil {
			via = nd
		} else if nd != big[0] {
			back = nd
		}
	}
	chunk := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{'x'}, 900<<10))
	var items []string
	for range 5 {
		items = append(items, `{"payload":"`+chunk+`","payload_encoding":"base64"}`)
	}
	via.api.Do(http.MethodPost, topicPath("big")+"/produce-batch", []byte(`{"messages":[`+strings.Join(items, ",")+`]}`),
		"Content-Type", "application/json").Expect(t, http.StatusAccepted)
	if ms := back.api.consumeBatch("big", 10, "5s"); len(ms) != 5 {
		t.Fatalf("a consume-batch via %s of the 4.5 MiB batch held by %s brought %d messages, want 5", back.id, big[0].id, len(ms))
	}

	// Fan-out across nodes: each parent partition's holder copies it into the child's
	// partitions wherever they live; the child's lag reads the same on every node.
	placed(t, nodes, "kid", map[string]any{"partitions": 3})
	nodes[1].api.PostJSON(topicPath("routed")+"/children", map[string]any{"child": "kid"}).Expect(t, http.StatusCreated)
	for i := range 6 {
		nodes[i%3].api.produce("routed", []byte(fmt.Sprintf(`{"copy":%d}`, i)), "application/json", "partition="+strconv.Itoa(i%3))
	}
	for _, nd := range nodes {
		waitFor(t, 30*time.Second, "the child's lag to reach 0 on "+nd.id, func() bool {
			r, err := nd.api.Try(http.MethodGet, topicPath("routed")+"/children", nil)
			return err == nil && r.Status == http.StatusOK && nd.api.lagOf("routed", "kid") == 0
		})
	}
	copies := map[string]int{}
	for _, m := range nodes[0].api.drain("kid") {
		copies[string(m.Payload)]++
	}
	for i := range 6 {
		if c := copies[fmt.Sprintf(`{"copy":%d}`, i)]; c != 1 {
			t.Fatalf("message %d reached the child %d times (child holds %v)", i, c, copies)
		}
	}
	if len(copies) != 6 {
		t.Fatalf("the child holds %v, want the 6 messages produced after the attach", copies)
	}
}

// TestClusterRemoteLongPollAndFaults: a consume parked on one node is woken by a
// produce to a partition another node holds, well within its wait; with a holder
// stopped (SIGSTOP), a produce to its partition answers 503 timeout (the outcome is
// unknown) and is not sent to another partition, other partitions keep serving, a
// saturated holder answers 503 at once, and once it runs again the writes that timed
// out are stored at most once, in their partition; with a holder killed, its partition answers 503
// with Retry-After promptly while keyless produces go to partitions that are up, and
// the topic is still shown, that partition marked unavailable; once it restarts, every
// message produced through another node is there once, and of those acked through it
// none comes back while the others do.
func TestClusterRemoteLongPollAndFaults(t *testing.T) {
	t.Parallel()
	nodes := startPeersCluster(t, 3, "--max-peer-inflight", "2")
	agreed(t, wantMembers(nodes...), nodes...)
	holders := placed(t, nodes, "faults", map[string]any{"partitions": 3})
	a := nodes[0]
	var remote int // a partition a does not hold
	for p, h := range holders {
		if h != a {
			remote = p
			break
		}
	}
	b := holders[remote]

	// A long poll on a, woken by a produce on b to b's own partition.
	woke := make(chan time.Duration, 1)
	var sent time.Time
	var mu sync.Mutex
	go func() {
		m := a.api.consume("faults", "wait=20s")
		mu.Lock()
		defer mu.Unlock()
		if m == nil || m.Partition != int32(remote) {
			woke <- -1
			return
		}
		woke <- time.Since(sent)
	}()
	waitParked(t, a.api, 1)
	mu.Lock()
	sent = time.Now()
	mu.Unlock()
	b.api.produce("faults", []byte(`{"wake":1}`), "application/json", "partition="+strconv.Itoa(remote))
	select {
	case d := <-woke:
		if d < 0 {
			t.Fatalf("the parked consume on %s did not return the message produced on %s", a.id, b.id)
		}
		t.Logf("a long poll on %s woke %v after a produce on %s to its partition %d", a.id, d.Round(time.Millisecond), b.id, remote)
	case <-time.After(15 * time.Second):
		t.Fatalf("the parked consume on %s was not woken within 15s by a produce on %s", a.id, b.id)
	}

	// Stop b: three produces at once through a to b's partition. Two are in flight and
	// time out with an unknown outcome; the third is past --max-peer-inflight 2 and is
	// refused at once.
	b.Pause()
	type answer struct {
		payload string
		status  int
		body    string
		retry   string
		took    time.Duration
	}
	answers := make(chan answer, 3)
	for i := range 3 {
		go func() {
			payload := `{"maybe":` + strconv.Itoa(i) + `}`
			start := time.Now()
			r, err := a.api.Try(http.MethodPost, topicPath("faults")+"/produce?partition="+strconv.Itoa(remote), []byte(payload), "Content-Type", "application/json")
			if err != nil {
				answers <- answer{payload: payload, body: err.Error()}
				return
			}
			answers <- answer{payload, r.Status, string(r.Body), r.Header.Get("Retry-After"), time.Since(start)}
		}()
	}
	var timedOut, refused []string
	for range 3 {
		an := <-answers
		switch {
		case an.status == http.StatusServiceUnavailable && strings.Contains(an.body, `"timeout"`) && an.retry != "" && an.took < 15*time.Second:
			timedOut = append(timedOut, an.payload)
		case an.status == http.StatusServiceUnavailable && strings.Contains(an.body, "max-peer-inflight") && an.retry != "":
			refused = append(refused, an.payload)
		default:
			t.Fatalf("produce to a stopped holder: %d %s (Retry-After %q) after %v; want 503 timeout, or 503 saturated for the third", an.status, an.body, an.retry, an.took)
		}
	}
	if len(timedOut) != 2 || len(refused) != 1 {
		t.Fatalf("produces to a stopped holder: timed out %v, refused %v; want two timed out and one refused", timedOut, refused)
	}
	// The other partitions keep serving, through a, while b is stopped.
	for p, h := range holders {
		if h != b {
			a.api.produce("faults", []byte(`{"up":`+strconv.Itoa(p)+`}`), "application/json", "partition="+strconv.Itoa(p))
		}
	}
	// While b is marked down, its partition answers 503 unavailable at once.
	r := a.api.Do(http.MethodPost, topicPath("faults")+"/produce?partition="+strconv.Itoa(remote), []byte(`{"down":1}`), "Content-Type", "application/json")
	if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Fatalf("produce to a stopped holder: %d %s (Retry-After %q), want 503 with Retry-After", r.Status, r.Body, r.Header.Get("Retry-After"))
	}
	b.Resume()
	// A write that timed out may or may not be stored (the stream is reset at the
	// deadline, so a holder that had not read it yet never runs it), but never twice
	// and never in another partition; a refused write is stored nowhere.
	waitFor(t, 30*time.Second, "the resumed holder's partition to be served again", func() bool {
		r, err := a.api.Try(http.MethodGet, topicPath("faults")+"/partitions/"+strconv.Itoa(remote)+"/messages?from=0&max=100", nil)
		return err == nil && r.Status == http.StatusOK
	})
	count := map[string]int{}
	for p := range 3 {
		for _, m := range a.api.readAll("faults", p) {
			count[string(m.Payload)]++
			if strings.HasPrefix(string(m.Payload), `{"maybe"`) && p != remote {
				t.Fatalf("the write %s to partition %d is stored in partition %d", m.Payload, remote, p)
			}
		}
	}
	for _, p := range timedOut {
		if count[p] > 1 {
			t.Fatalf("the timed-out write %s is stored %d times, want at most once", p, count[p])
		}
	}
	if count[refused[0]] != 0 || count[`{"down":1}`] != 0 {
		t.Fatalf("a refused write is stored: %s %d times, {\"down\":1} %d times", refused[0], count[refused[0]], count[`{"down":1}`])
	}

	// Kill the holder of a's other remote partition: its partition answers 503
	// promptly, keyless produces go to partitions that are up.
	// Before the kill: 20 messages produced through a into b's partition (202), and 10
	// of them consumed and acked through a (204).
	const durable = 20
	for i := range durable {
		a.api.produce("faults", []byte(`{"dur":`+strconv.Itoa(i)+`}`), "application/json", "partition="+strconv.Itoa(remote))
	}
	acked := map[string]bool{}
	waitFor(t, 30*time.Second, "10 of the forwarded messages to be consumed and acked through "+a.id, func() bool {
		for _, m := range a.api.consumeBatch("faults", 100, "200ms") {
			if strings.HasPrefix(string(m.Payload), `{"dur"`) && len(acked) < durable/2 {
				a.api.mustAck("faults", &m)
				acked[string(m.Payload)] = true
			}
		}
		return len(acked) == durable/2
	})
	b.Kill()
	waitFor(t, 30*time.Second, "a request for the dead node's partition to answer 503 promptly", func() bool {
		start := time.Now()
		r, err := a.api.Try(http.MethodPost, topicPath("faults")+"/produce?partition="+strconv.Itoa(remote), []byte(`{"dead":1}`), "Content-Type", "application/json")
		return err == nil && r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") != "" && time.Since(start) < 2*time.Second
	})
	// The topic is still shown, the dead node's partition marked unavailable.
	for _, ps := range a.api.topic("faults").PartitionStats {
		want := int(ps.Partition) != remote
		if ps.Available == nil || *ps.Available != want {
			t.Fatalf("GET the topic with %s dead: partition %d available %v, want %v", b.id, ps.Partition, ps.Available, want)
		}
	}
	for i := range 6 {
		p := a.api.produce("faults", []byte(`{"keyless":`+strconv.Itoa(i)+`}`), "application/json", "")
		if int(p.Partition) == remote {
			t.Fatalf("a keyless produce went to partition %d of the dead node", remote)
		}
	}
	// Keyless messages sent to a went to the partition a holds (they are not
	// forwarded); the third partition, held by the node still up, gets some by name.
	for p, h := range holders {
		if h != a && h != b {
			for i := range 3 {
				a.api.produce("faults", []byte(`{"third":`+strconv.Itoa(i)+`}`), "application/json", "partition="+strconv.Itoa(p))
			}
		}
	}
	// Consumes on a serve the partitions that are up.
	seen := map[int32]bool{}
	for range 20 {
		ms := a.api.consumeBatch("faults", 10, "200ms")
		for _, m := range ms {
			seen[m.Partition] = true
		}
		if len(ms) == 0 {
			break
		}
	}
	var ps []int
	for p := range seen {
		ps = append(ps, int(p))
	}
	sort.Ints(ps)
	if len(ps) != 2 {
		t.Fatalf("consumes on %s with %s dead served partitions %v; want the two that are up", a.id, b.id, ps)
	}

	// b comes back from kill -9: every message answered 202 through a is in its
	// partition, once; the unacked ones are delivered again, the acked ones never.
	b.Launch()
	waitFor(t, 60*time.Second, "the restarted holder's partition to be served through "+a.id, func() bool {
		r, err := a.api.Try(http.MethodGet, topicPath("faults")+"/partitions/"+strconv.Itoa(remote)+"/messages?from=0&max=1", nil)
		return err == nil && r.Status == http.StatusOK
	})
	stored := map[string]int{}
	for _, m := range a.api.readAll("faults", remote) {
		stored[string(m.Payload)]++
	}
	for i := range durable {
		if p := `{"dur":` + strconv.Itoa(i) + `}`; stored[p] != 1 {
			t.Fatalf("after kill -9 of %s, %s is stored %d times, want once", b.id, p, stored[p])
		}
	}
	again := map[string]bool{}
	waitFor(t, 60*time.Second, "the unacked forwarded messages to be delivered again", func() bool {
		// When b was the controller, a's metadata lease may run out while the others
		// elect a new one (reads need no lease and answer 200; consumes answer 503
		// unavailable with Retry-After until a renews). Seen in make test on 4
		// December for 0.8 s, most of it a renewal waiting on the dead controller,
		// which no longer happens (meta.TestALeaseRenewsWithANewControllerAtOnce). A
		// 503 with Retry-After is a legal answer; what this test holds to is below:
		// nothing acked comes back, every unacked message does.
		r, err := a.api.Try(http.MethodGet, topicPath("faults")+"/consume-batch?max=100&wait=200ms", nil)
		if err != nil || r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") != "" {
			return false
		}
		var l struct {
			Messages []message `json:"messages"`
		}
		if r.Status != http.StatusNoContent && r.Expect(t, http.StatusOK) {
			r.JSON(t, &l)
		}
		for _, m := range l.Messages {
			p := string(m.Payload)
			if acked[p] {
				t.Fatalf("%s was acked (204) through %s before %s was killed, and was delivered again", p, a.id, b.id)
			}
			if strings.HasPrefix(p, `{"dur"`) {
				again[p] = true
			}
		}
		return len(again) == durable-len(acked)
	})
}

// TestClusterSecurityForwarded: with security on, a request is authenticated and
// authorized on the node the client reached, and its partition operation is forwarded
// without credentials: a producer allowed on the topic produces to every partition
// through every node, a user without a grant on the topic is refused there as on a
// single node (404: the topic is hidden from it), and nothing of it is stored.
func TestClusterSecurityForwarded(t *testing.T) {
	t.Parallel()
	nodes := startPeersClusterEnv(t, 3, []string{"NARAD_ADMIN_PASSWORD=" + adminPass})
	for _, nd := range nodes {
		nd.api = &api{Client: nd.Client().WithBasicAuth("admin", adminPass), t: t}
	}
	agreed(t, wantMembers(nodes...), nodes...)
	placed(t, nodes, "sec", map[string]any{"partitions": 3})
	nodes[0].api.createUser("writer", "writer-pass", grant("produce", "sec"))
	nodes[0].api.createUser("other", "other-pass", grant("produce", "elsewhere"))
	for _, nd := range nodes {
		writer := &api{Client: nd.Client().WithBasicAuth("writer", "writer-pass"), t: t}
		other := &api{Client: nd.Client().WithBasicAuth("other", "other-pass"), t: t}
		for p := range 3 {
			// The user may have reached this node before its metadata has the user.
			waitFor(t, 30*time.Second, "writer to produce via "+nd.id, func() bool {
				r, err := writer.Try(http.MethodPost, topicPath("sec")+"/produce?partition="+strconv.Itoa(p), []byte(`{"by":"writer"}`), "Content-Type", "application/json")
				return err == nil && r.Status == http.StatusAccepted
			})
			r, err := other.Try(http.MethodPost, topicPath("sec")+"/produce?partition="+strconv.Itoa(p), []byte(`{"by":"other"}`), "Content-Type", "application/json")
			// A user with no grant on a topic is not told it exists, as on one node.
			if err != nil || r.Status != http.StatusNotFound {
				t.Fatalf("a user without a grant on sec, via %s: %v %v, want 404", nd.id, err, r)
			}
		}
	}
	for p := range 3 {
		ms := nodes[0].api.readAll("sec", p)
		if len(ms) != 3 {
			t.Fatalf("partition %d holds %d messages, want 3 (one per node)", p, len(ms))
		}
		for _, m := range ms {
			if string(m.Payload) != `{"by":"writer"}` {
				t.Fatalf("partition %d holds %s", p, m.Payload)
			}
		}
	}
}
