package scenario

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/verify/check"
	"github.com/narad-mq/narad/verify/history"
	"github.com/narad-mq/narad/verify/workload"
)

// clusterChaosSteps is the make-test tier's fault schedule: 3 kills of a partition's
// leader, 1 of the controller, a double failover, every node killed within 10 ms, a
// node killed to have one of its replicas' files damaged, and one killed to start with
// a segment write failing (EIO or ENOSPC) or slow, then again (12 kill -9s in all), 2
// SIGSTOPs past the election timeout, and a leader cut off the node plane both ways
// (chaosnet). A node killed alone takes about 10 s to be ready again on a loaded
// machine; the kill-all and the double failover restart their nodes together.
var clusterChaosSteps = map[string]int{
	workload.StepLeaderKill: 3, workload.StepControllerKill: 1, workload.StepDoubleFailover: 1, workload.StepKillAll: 1,
	workload.StepPause: 2, workload.StepNetCut: 1, workload.StepCorrupt: 1, workload.StepDisk: 1,
}

// runCluster runs w on a cluster of three nodes (chaosNet: nodes that poll a chaosnet
// rules file), seeded by NARAD_VERIFY_SEED or the clock, logs the run's summary, and
// fails the test, keeping the run's files, when the run did not pass. what names the
// run in that failure.
func runCluster(t *testing.T, what string, chaosNet bool, w workload.Config) *Result {
	t.Helper()
	s := seed(t)
	t.Logf("seed %d (repeat with NARAD_VERIFY_SEED=%d)", s, s)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	w.Seed = s
	res := Run(ctx, Config{Keep: true, Log: t.Logf, Nodes: 3, ChaosNet: chaosNet, Workload: w})
	var b bytes.Buffer
	Summary(&b, res)
	t.Logf("\n%s", b.String())
	if !res.OK() {
		t.Fatalf("the %s run failed; everything is kept in %s (seed %d)", what, res.Dir, s)
	}
	return res
}

// TestClusterChaos is the cluster's make-test tier: three nodes, topics orders and
// events of 6 partitions and 3 replicas each, a fan-out child and a 2 s delay child of
// orders, 2 s leases, at least 15,000 messages under the schedule above; the checker
// must find nothing, every replica must hold the same records once the nodes are
// stopped. Then it doctors its own history every way check.ClusterDoctorKinds knows
// and requires the checker to flag each, so the cluster's rules can fail.
func TestClusterChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the cluster chaos run takes about two minutes")
	}
	t.Parallel()
	res := runCluster(t, "cluster chaos", true, workload.Config{
		Messages: 15500, LoadDuration: 45 * time.Second, VisibilityMs: 2000, DelayMs: 2000, DrainTimeout: 3 * time.Minute,
		ClusterFaults: workload.ClusterFaultConfig{Steps: clusterChaosSteps, MinGap: 500 * time.Millisecond, MaxGap: 1500 * time.Millisecond},
	})
	st := res.Stats
	if n := st.Faults[history.FaultKill]; n < 8 {
		t.Fatalf("only %d kills -9", n)
	}
	if st.Faults[history.FaultPause] < 2 || st.Faults[history.FaultNet] < 1 || st.Faults[history.FaultCorrupt] < 1 {
		t.Fatalf("faults %v: want 2 pauses, a network cut and a damaged file", st.Faults)
	}
	if st.NetLeaderMoved < 1 {
		t.Fatalf("no cut-off leader was replaced while cut off: the cut did not take (is the binary built with -tags chaosnet?)")
	}
	if n := res.Report.Messages; n < 15000 {
		t.Fatalf("only %d messages", n)
	}
	es, err := history.Read(filepath.Join(res.Dir, "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	// A failed segment write on a node (not a slow one) stops a replica's applying: it
	// must hand its leadership over and be rebuilt from its group while the node runs.
	failedWrites := 0
	for _, e := range es {
		if e.Kind == history.KindFault && e.Fault == history.FaultDisk && strings.HasPrefix(e.Detail, "segment-after-write") && (strings.HasSuffix(e.Detail, ": eio") || strings.HasSuffix(e.Detail, ": enospc")) {
			failedWrites++
		}
	}
	if failedWrites > 0 {
		logs, _ := filepath.Glob(filepath.Join(res.Dir, "node-*.log"))
		rebuilt := 0
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			rebuilt += strings.Count(string(b), "failed a write while serving; it is set aside in damaged/ and rebuilt")
		}
		if rebuilt == 0 {
			t.Errorf("%d segment writes failed on a node, and no replica was rebuilt", failedWrites)
		}
	}
	for kind, want := range check.ClusterDoctorKinds {
		doctored, what, err := check.DoctorCluster(es, kind)
		if err != nil {
			t.Fatalf("doctor %s: %v", kind, err)
		}
		if r := check.Check(doctored); r.OK() || r.Violations[want] == 0 {
			t.Errorf("doctored with %s (%s): flagged %v, want %s", kind, what, r.Violations, want)
		}
	}
	if !t.Failed() {
		os.RemoveAll(res.Dir)
	}
}

// TestClusterClockSkew: n2's wall clock runs 8 s ahead of the run's and n3's 6 s behind
// from their first start, and n1's gains 30 ms a second across its restarts (the
// failpoints build's clock seam), a clock step restarts a node with another offset
// (every other seed, a drift too), and two partitions' leaders are killed. Records carry
// their leader's clock, and the delay child and retention judge time by the stamps
// against the acting node's clock, so a skew may move a delayed copy by the skew, and
// nothing else: the checker holds the cluster's contract, with early delays excused
// only by the offsets the nodes ran with (TestClockSteps in check/ shows it flags what
// they do not excuse). Not in TestClusterChaos: a skew of seconds excuses the early
// copy that run's doctor adds.
func TestClusterClockSkew(t *testing.T) {
	if testing.Short() {
		t.Skip("the clock skew run takes about a minute")
	}
	t.Parallel()
	res := runCluster(t, "clock skew", false, workload.Config{
		Messages: 6000, LoadDuration: 30 * time.Second, VisibilityMs: 2000, DelayMs: 2000, DrainTimeout: 3 * time.Minute,
		ClusterFaults: workload.ClusterFaultConfig{Steps: map[string]int{workload.StepClock: 1, workload.StepLeaderKill: 2},
			MinGap: 500 * time.Millisecond, MaxGap: 1500 * time.Millisecond,
			ClockOffsets: map[string]time.Duration{"n2": 8 * time.Second, "n3": -6 * time.Second},
			ClockDrifts:  map[string]float64{"n1": 0.03}},
	})
	if n := res.Stats.Faults[history.FaultClock]; n < 1 {
		t.Fatalf("no clock step was taken: faults %v", res.Stats.Faults)
	}
	if n := res.Report.Messages; n < 6000 {
		t.Fatalf("only %d messages", n)
	}
	// The skew reached the records: messages of the parent topics carry stamps seconds
	// off the run's clock while they were produced (a skewed node led their partition),
	// so the checker judged a skewed cluster, not a run whose offsets the binary ignored.
	es, err := history.Read(filepath.Join(res.Dir, "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var wallStart int64
	type span struct{ first, last int64 }
	produced := map[string]*span{}
	for _, e := range es {
		switch {
		case e.Kind == history.KindRun && e.Run != nil:
			wallStart = e.Run.WallStart
		case e.Kind == history.KindOp && e.Op == history.OpProduce:
			if p := produced[e.Msg]; p == nil {
				produced[e.Msg] = &span{e.Call, e.Return}
			} else {
				p.last = max(p.last, e.Return)
			}
		}
	}
	var ahead, behind int
	for _, e := range es {
		p := produced[e.Msg]
		if e.Kind != history.KindOp || e.Op != history.OpConsume || e.Status != 200 || e.Timestamp == 0 || p == nil || (e.Topic != "orders" && e.Topic != "events") {
			continue
		}
		ms := func(at int64) int64 { return (wallStart + at) / int64(time.Millisecond) }
		switch {
		case e.Timestamp > ms(p.last)+2000:
			ahead++
		case e.Timestamp < ms(p.first)-2000:
			behind++
		}
	}
	t.Logf("deliveries stamped over 2 s after their produce's last attempt returned: %d; before its first was sent: %d", ahead, behind)
	if ahead+behind == 0 {
		t.Fatalf("the nodes' clock offsets did not show in the stamps (is the binary built with -tags failpoints?)")
	}
	os.RemoveAll(res.Dir)
}

// TestClusterQuiet: a quiet three-node cluster (no faults, 30 s leases, every consumer
// acking at once) takes 20,000 messages, and each is sent once, delivered once in its
// topic and in each child of orders, and acked once with 204.
func TestClusterQuiet(t *testing.T) {
	if testing.Short() {
		t.Skip("the quiet cluster run takes about a minute")
	}
	t.Parallel()
	res := runCluster(t, "quiet cluster", false, workload.Config{Messages: 20000, VisibilityMs: 30000, DelayMs: 2000, Quiet: true, DrainTimeout: 3 * time.Minute})
	es, err := history.Read(filepath.Join(res.Dir, "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if err := exactlyOnce(es, 20000); err != "" {
		// Name a failover no fault made: a node the others found silent for the 1 s
		// liveness timeout (a stall of the machine, or of the node).
		t.Fatalf("%s (partitions changed leader %d times with no fault: %s); everything is kept in %s (seed %d)", err, len(epochRises(es)), strings.Join(firstN(epochRises(es), 5), "; "), res.Dir, res.Report.Seed)
	}
	os.RemoveAll(res.Dir)
}

// exactlyOnce checks a quiet run: want messages, each produced with one attempt
// answered 202, delivered exactly once in its topic (and, for orders, in orders.copy
// and orders.later), and acked exactly once, answered 204; nothing else failed.
func exactlyOnce(es []history.Entry, want int) string {
	produced := map[string]string{} // id → topic
	delivered := map[[2]string]int{}
	acked := map[[2]string]int{}
	for _, e := range es {
		if e.Kind != history.KindOp {
			continue
		}
		if (e.Op == history.OpConsume || e.Op == history.OpRead) && e.Status == 0 && strings.Contains(e.Err, "context canceled") {
			// A long poll, or a replay's read, the harness ended when the drain was done:
			// it leased nothing (a replay read in flight at the end once failed the run).
			continue
		}
		if e.Status == 0 || e.Status >= 500 {
			return "an attempt failed: " + e.Op + " " + e.Topic + " " + e.Err
		}
		switch e.Op {
		case history.OpProduce:
			if _, dup := produced[e.Msg]; dup || e.Status != 202 {
				return "message " + e.Msg + " was produced twice or refused: " + e.Err
			}
			produced[e.Msg] = e.Topic
		case history.OpConsume:
			if e.Status == 200 && e.Msg != "" {
				delivered[[2]string{e.Topic, e.Msg}]++
			}
		case history.OpAck:
			if e.Status != 204 {
				return "an ack of " + e.Msg + " in " + e.Topic + " answered " + e.Err
			}
			acked[[2]string{e.Topic, e.Msg}]++
		case history.OpNack, history.OpExtend:
			return "a quiet run sent a " + e.Op
		}
	}
	if len(produced) != want {
		return "produced " + itoa(len(produced)) + " messages, want " + itoa(want)
	}
	copies := 0
	for id, topic := range produced {
		topics := []string{topic}
		if topic == workload.Parent {
			topics = append(topics, workload.Copy, workload.Delayed)
		}
		for _, tp := range topics {
			k := [2]string{tp, id}
			if delivered[k] != 1 || acked[k] != 1 {
				return id + " in " + tp + " was delivered " + itoa(delivered[k]) + " times and acked " + itoa(acked[k]) + " times, want once each"
			}
			copies++
		}
	}
	if len(delivered) != copies {
		return "deliveries of ids never produced"
	}
	return ""
}

// epochRises lists the stats samples that show a partition's epoch above the last one
// seen (a change of leader).
func epochRises(es []history.Entry) []string {
	high := map[[2]any]int64{}
	var out []string
	for _, e := range es {
		if e.Kind != history.KindStats || e.Epoch == 0 {
			continue
		}
		k := [2]any{e.Topic, e.Partition}
		if h, ok := high[k]; ok && e.Epoch > h {
			out = append(out, fmt.Sprintf("%s/%d epoch %d→%d (leader %s) at %v", e.Topic, e.Partition, h, e.Epoch, e.Target, time.Duration(e.Call).Round(100*time.Millisecond)))
		}
		high[k] = max(high[k], e.Epoch)
	}
	return out
}

func firstN(s []string, n int) []string { return s[:min(n, len(s))] }

func itoa(n int) string { return strconv.Itoa(n) }
