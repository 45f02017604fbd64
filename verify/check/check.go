// Package check decides whether a recorded history obeys the delivery contract
// (DESIGN.md §3). A porcupine model checks every message copy's leases and settles (a
// delivery after a 204 ack is legal only if a kill raced that ack; a second delivery
// under a live lease is illegal; a 410 on a surely live lease is a bug); linear checks
// count lost and unexpected messages, classify every duplicate by its cause, and check
// the markers, fan-out, delays (allowing for forward clock steps across restarts),
// retention, timestamps, log order, operation bounds, and the incarnations of a topic
// deleted and recreated under load.
package check

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/narad-mq/narad/verify/history"
)

// Duplicate causes.
const (
	CauseLeaseLapse = "lease-lapse"
	CauseNack       = "nack"
	CauseAmbiguous  = "ambiguous-produce"
	CauseKill       = "kill-window"
	// CauseDamagedSettle: the settle record of an ack was damaged on disk (by the
	// harness), and the node reported skipping it on start: its messages come back.
	CauseDamagedSettle = "damaged-settle"
	// CauseLeaderChange (a cluster run): the partition may have changed leader between
	// the two deliveries (a kill, pause or network fault, or its epoch rose), and the
	// leases died with the old leader.
	CauseLeaderChange = "leader-change"
	// CauseFanoutRecopy (a cluster run): a child's second copy of a parent message at
	// another offset, after a change of leader of the parent (or a crash): the new leader
	// copies from its own cursor, which is not replicated.
	CauseFanoutRecopy = "fanout-recopy"
	CauseNone         = "none"
)

// opBound is the longest an answered operation may take outside fault windows (the
// long poll's wait is added for consumes).
const opBound = 10 * time.Second

// deleteLandsBy is the last moment a topic delete of unknown outcome (no answer, or
// 503 timeout), answered at ret, may take effect, given the run's fault windows ks:
// its controller may commit it only after the control plane elects a controller again,
// until the next fault after its answer ends (or its answer, when none follows), plus
// the bound of an operation outside faults. Check and Doctor use the same bound, so a
// doctored history is judged on the incarnation lives it was doctored on.
func deleteLandsBy(ks kills) func(ret int64) int64 {
	return func(ret int64) int64 {
		end := ks.nextEnd(ret)
		if end == never {
			end = ret
		}
		return end + int64(opBound)
	}
}

// Violation is one broken rule.
type Violation struct {
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// Report is the checker's answer.
type Report struct {
	Seed            int64          `json:"seed"`
	Messages        int            `json:"messages"` // distinct message ids answered 202
	MessagesByTopic map[string]int `json:"messages_by_topic"`
	Produced        int            `json:"produce_attempts"`
	Deliveries      int            `json:"deliveries"`
	Faults          map[string]int `json:"faults"`
	FailpointKills  map[string]int `json:"failpoint_kills"`
	Lost            map[string]int `json:"lost"` // by topic
	LostIDs         []string       `json:"lost_ids,omitempty"`
	AgedOut         int            `json:"aged_out"`
	Unexpected      int            `json:"unexpected"`
	// Replayed counts messages read back by replays (no lease), each held to the
	// payload seen at its offset.
	Replayed         int            `json:"replayed"`
	Duplicates       map[string]int `json:"duplicates"`
	AckedRedelivered int            `json:"acked_redelivered_in_kill_window"`
	// DamagedSkipped counts messages never delivered because the harness damaged their
	// record and the node reported skipping it (legal: the documented outcome).
	// SettleDamaged counts acked messages delivered again because the harness damaged
	// the settle record of their ack and the node reported skipping it (legal).
	DamagedSkipped int `json:"damaged_skipped"`
	SettleDamaged  int `json:"acked_redelivered_damaged_settle"`
	// Incarnations counts each recreated topic's incarnations seen; DroppedWithTopic the
	// messages 202'd into an incarnation that was deleted, never delivered (legal).
	Incarnations     map[string]int `json:"incarnations,omitempty"`
	DroppedWithTopic int            `json:"dropped_with_deleted_incarnation"`
	// ClockOffsets lists the wall-clock offsets nodes ran with, in order; EarlyByClock
	// counts delay copies and retention deletions that came earlier than the run's own
	// clock allows, within what forward steps excuse (legal).
	ClockOffsets []string `json:"clock_offsets,omitempty"`
	EarlyByClock int      `json:"early_by_clock_step"`
	// MaxEarlyByClock is the most any of them came early (ns).
	MaxEarlyByClock int64                `json:"max_early_by_clock_step_ns"`
	Violations      map[string]int       `json:"violations"`
	Examples        []Violation          `json:"examples,omitempty"` // the first few of each kind
	Latency         map[string][2]string `json:"latency_p50_p99"`
	Drained         bool                 `json:"drained"`
	// Availability: per operation, the share of attempts answered without a 5xx.
	Availability map[string]string `json:"availability"`
	// A cluster run: partitions whose replicas were compared after the stop, and the
	// records they held (every node's, summed).
	Nodes int `json:"nodes,omitempty"`
	// StaleSamples counts stats samples of a cluster run read through a node while it
	// was paused or cut off, or within staleAfter of it: not held to the marker rules.
	StaleSamples     int `json:"stale_samples,omitempty"`
	ReplicasCompared int `json:"replicas_compared,omitempty"`
	ReplicaRecords   int `json:"replica_records,omitempty"`
}

// OK reports whether nothing was lost or unexpected and no rule was broken.
func (r *Report) OK() bool {
	n := r.Unexpected
	for _, v := range r.Lost {
		n += v
	}
	for _, v := range r.Violations {
		n += v
	}
	return n == 0
}

func (r *Report) violate(kind, format string, args ...any) {
	r.Violations[kind]++
	if r.Violations[kind] <= 5 {
		r.Examples = append(r.Examples, Violation{kind, fmt.Sprintf(format, args...)})
	}
}

func (r *Report) earlyByClock(by int64) {
	r.EarlyByClock++
	r.MaxEarlyByClock = max(r.MaxEarlyByClock, by)
}

// Print writes the report for people.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "seed:              %d\n", r.Seed)
	fmt.Fprintf(w, "messages:          %d (202'd ids: %s; %d produce attempts, %d deliveries)\n", r.Messages, kv(r.MessagesByTopic), r.Produced, r.Deliveries)
	fmt.Fprintf(w, "faults:            %s\n", kv(r.Faults))
	fmt.Fprintf(w, "failpoint kills:   %s\n", kv(r.FailpointKills))
	fmt.Fprintf(w, "lost:              %s (aged out by retention, legal: %d)\n", kv(r.Lost), r.AgedOut)
	fmt.Fprintf(w, "unexpected:        %d\n", r.Unexpected)
	fmt.Fprintf(w, "replayed:          %d messages read back without a lease, each the one seen at its offset\n", r.Replayed)
	fmt.Fprintf(w, "duplicates:        %s\n", kv(r.Duplicates))
	if r.Nodes <= 1 {
		fmt.Fprintf(w, "acked, redelivered inside a kill window (legal by the rule): %d\n", r.AckedRedelivered)
	}
	if r.DamagedSkipped+r.SettleDamaged > 0 || r.Faults[history.FaultDamaged] > 0 {
		fmt.Fprintf(w, "damaged on disk:   %d messages skipped and reported (legal), %d acked messages redelivered after a damaged settle record (legal)\n", r.DamagedSkipped, r.SettleDamaged)
	}
	if len(r.Incarnations) > 0 {
		var parts []string
		for t, n := range r.Incarnations {
			parts = append(parts, fmt.Sprintf("%s %d", t, n))
		}
		sort.Strings(parts)
		fmt.Fprintf(w, "incarnations:      %s (202'd into a deleted incarnation, never delivered (legal): %d)\n", strings.Join(parts, ", "), r.DroppedWithTopic)
	}
	if len(r.ClockOffsets) > 0 {
		fmt.Fprintf(w, "clock offsets:     0 → %s (early by a forward step (legal): %d, by at most %s)\n", strings.Join(r.ClockOffsets, " → "), r.EarlyByClock, ms(r.MaxEarlyByClock))
	}
	fmt.Fprintf(w, "violations:        %s\n", kv(r.Violations))
	for _, v := range r.Examples {
		fmt.Fprintf(w, "  %s: %s\n", v.Kind, v.Detail)
	}
	fmt.Fprintf(w, "latency p50/p99:   %s\n", kv2(r.Latency))
	fmt.Fprintf(w, "availability:      %s\n", kvs(r.Availability))
	if r.Nodes > 1 {
		fmt.Fprintf(w, "replicas:          %d nodes; %d partitions compared after the stop, byte for byte; %d records held in all\n", r.Nodes, r.ReplicasCompared, r.ReplicaRecords)
		fmt.Fprintf(w, "stale samples:     %d stats samples read through a paused or cut-off node (not held to the marker rules)\n", r.StaleSamples)
	}
	fmt.Fprintf(w, "drained:           %v\n", r.Drained)
	if r.OK() {
		fmt.Fprintln(w, "verdict:           OK")
	} else {
		fmt.Fprintln(w, "verdict:           FAILED")
	}
}

func kv(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	total := 0
	for k, v := range m {
		keys = append(keys, k)
		total += v
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%d (", total)
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	b.WriteString(")")
	return b.String()
}

func kvs(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+" "+m[k])
	}
	return strings.Join(parts, ", ")
}

func kv2(m map[string][2]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %s/%s", k, m[k][0], m[k][1]))
	}
	return strings.Join(parts, ", ")
}

// firstAck returns when the first ack of a copy that answered 204 was sent (the end of
// time if none did).
func firstAck(ops []opIn) int64 {
	at := int64(1 << 62)
	for _, o := range ops {
		if o.kind == kAck && o.out == oOK {
			at = min(at, o.call)
		}
	}
	return at
}

// copyKey names one copy of a message: a recreated topic's offsets start again in each
// incarnation, so its copies are told apart by incarnation (0 for every other topic).
type copyKey struct {
	topic     string
	inc       int64
	partition int32
	offset    int64
}

func (k copyKey) String() string {
	if k.inc != 0 {
		return fmt.Sprintf("%s#%d/%d@%d", k.topic, k.inc, k.partition, k.offset)
	}
	return fmt.Sprintf("%s/%d@%d", k.topic, k.partition, k.offset)
}

type window struct{ start, end int64 }

// Check checks a history.
func Check(es []history.Entry) *Report {
	es = withUnansweredIntents(es)
	r := &Report{MessagesByTopic: map[string]int{}, Faults: map[string]int{}, FailpointKills: map[string]int{}, Lost: map[string]int{},
		Duplicates: map[string]int{}, Violations: map[string]int{}, Latency: map[string][2]string{}, Incarnations: map[string]int{}}
	var run history.RunInfo
	topics := map[string]history.TopicInfo{}
	// cluster: the history is a cluster run's (RunInfo.Nodes), and the cluster's contract
	// holds: an ack answered 204 is committed on a quorum, so no crash excuses a delivery
	// after it; a stored copy at a second offset needs a second produce attempt that may
	// have stored it. Pauses and network faults may change a partition's leader (which
	// drops its leases) as a kill does, so they join the kills (ks, faultKills).
	cluster := false
	var faultWins []window // every fault's window, kills reaching to the next ready node
	lastKill := -1
	var clock clockTimeline
	drainAt, doneAt := int64(-1), int64(-1)
	// Damage: what the harness damaged (FaultDamaged) and what the node said it skipped
	// (FaultSkipped). Only the two together excuse a message that never came, or an acked
	// one that came back.
	type dkey struct {
		topic     string
		partition int32
		offset    int64
	}
	damagedMsg := map[dkey]history.Entry{}    // a message record the harness damaged
	damagedMsgID := map[[2]string][]dkey{}    // topic, message id → where
	damagedSettle := map[dkey]int64{}         // a message whose ack's settle record was damaged → when
	damagedSettleID := map[[2]string]int64{}  // topic, message id → when
	skippedMsg := map[dkey]bool{}             // the node skipped this message as damaged
	skippedSettle := map[dkey]bool{}          // the node lost a settle record here (offset -1)
	skippedCopy := map[dkey]map[string]bool{} // the node never copied this parent message, into these children
	for _, e := range es {
		switch e.Kind {
		case history.KindRun:
			if e.Run != nil {
				run = *e.Run
				cluster = len(run.Nodes) > 1
			}
		case history.KindQuiesce:
			if e.Detail != "ok" {
				r.violate("replicas-not-quiesced", "%s", e.Detail)
			}
		case history.KindPhase:
			switch e.Detail {
			case "drain":
				drainAt = e.Call
			case "done":
				doneAt = e.Call
			}
		case history.KindFault:
			r.Faults[e.Fault]++
			switch e.Fault {
			case history.FaultKill, history.FaultFailpointKill, history.FaultCrash:
				faultWins = append(faultWins, window{e.Call, e.Return})
				lastKill = len(faultWins) - 1
				if e.Fault == history.FaultFailpointKill {
					r.FailpointKills[e.Target]++
				}
				if e.Fault == history.FaultCrash {
					r.violate("node-crashed", "the node exited by itself at %s: %s", ms(e.Call), e.Detail)
				}
			case history.FaultRestart:
				if lastKill >= 0 && e.Return > faultWins[lastKill].end {
					faultWins[lastKill].end = e.Return
				}
				faultWins = append(faultWins, window{e.Call, e.Return})
			case history.FaultClock:
				clock = append(clock, clockLine{e.Call, e.ClockOffset, e.Target, e.ClockDrift})
				faultWins = append(faultWins, window{e.Call, e.Return})
			case history.FaultPause, history.FaultNet, history.FaultStop:
				faultWins = append(faultWins, window{e.Call, e.Return})
			case history.FaultDamaged:
				k := dkey{e.Topic, e.Partition, e.Offset}
				if e.Target == "journal" {
					damagedSettle[k] = e.Call
					if e.Msg != "" {
						damagedSettleID[[2]string{e.Topic, e.Msg}] = e.Call
					}
				} else {
					damagedMsg[k] = e
					damagedMsgID[[2]string{e.Topic, e.Msg}] = append(damagedMsgID[[2]string{e.Topic, e.Msg}], k)
				}
			case history.FaultSkipped:
				switch e.Target {
				case "journal":
					skippedSettle[dkey{e.Topic, e.Partition, -1}] = true
				case "fanout":
					k := dkey{e.Topic, e.Partition, e.Offset}
					if skippedCopy[k] == nil {
						skippedCopy[k] = map[string]bool{}
					}
					skippedCopy[k][e.Detail] = true
				default:
					skippedMsg[dkey{e.Topic, e.Partition, e.Offset}] = true
				}
			default:
				faultWins = append(faultWins, window{e.Call, e.Return})
			}
		}
	}
	r.Seed = run.Seed
	r.Nodes = len(run.Nodes)
	// A skip is legal only of a record the harness damaged; anything else means the node
	// took good data for bad, or lost data by itself.
	for k := range skippedMsg {
		if _, ok := damagedMsg[k]; !ok {
			r.violate("skipped-undamaged", "the node skipped %s/%d@%d as damaged, but the harness damaged no such record", k.topic, k.partition, k.offset)
		}
	}
	for k := range skippedCopy {
		if _, ok := damagedMsg[k]; !ok {
			r.violate("skipped-undamaged", "fan-out skipped %s/%d@%d as damaged, but the harness damaged no such record", k.topic, k.partition, k.offset)
		}
	}
	for k := range skippedSettle {
		found := false
		for d := range damagedSettle {
			found = found || (d.topic == k.topic && d.partition == k.partition)
		}
		if !found {
			r.violate("skipped-undamaged", "the node skipped a settle record of %s/%d as damaged, but the harness damaged none there", k.topic, k.partition)
		}
	}
	// settleLost reports whether the ack of the message at k (or with id) was undone by a
	// settle record the harness damaged after at, and the node reported it.
	// settleLostAt also says when the record was damaged.
	settleLostAt := func(topic string, partition int32, offset int64, id string, at int64) (int64, bool) {
		if !skippedSettle[dkey{topic, partition, -1}] {
			return 0, false
		}
		if t, ok := damagedSettle[dkey{topic, partition, offset}]; ok && t >= at {
			return t, true
		}
		t, ok := damagedSettleID[[2]string{topic, id}]
		return t, ok && id != "" && t >= at
	}
	settleLost := func(topic string, partition int32, offset int64, id string, at int64) bool {
		_, ok := settleLostAt(topic, partition, offset, id, at)
		return ok
	}
	sort.SliceStable(clock, func(i, j int) bool { return clock[i].at < clock[j].at })
	for _, c := range clock {
		o := fmtOffset(c.off)
		if c.drift != 0 {
			o += fmt.Sprintf(" %+.1f%%/s", 100*c.drift)
		}
		r.ClockOffsets = append(r.ClockOffsets, o)
	}
	// A delete whose outcome is unknown may still take effect after its answer
	// (deleteLandsBy): a soak (seed 2222226017) met one answered 503 timeout
	// ("leadership lost while committing") during a rolling restart and committed by the
	// next controller 1.2 s later.
	ks := faultKills(es)
	recreated := map[string]*incSet{}
	for _, t := range run.Topics {
		topics[t.Name] = t
		if t.Recreated {
			recreated[t.Name] = buildIncarnations(es, t.Name, deleteLandsBy(ks))
			r.Incarnations[t.Name] = len(recreated[t.Name].wins)
		}
	}
	// incOf is the incarnation a copy is keyed by: its handle's for a recreated topic.
	incOf := func(e history.Entry) int64 {
		if recreated[e.Topic] != nil {
			return e.Incarnation
		}
		return 0
	}
	// landEnd is the last moment an attempt could still have been written: its answer,
	// or for an attempt with no answer or a 5xx, the end of the next kill (the request may
	// run on after the client gave up, but not past the process's death).
	landEnd := func(e history.Entry) int64 {
		if e.Status > 0 && e.Status < 500 {
			return e.Return
		}
		return ks.nextEnd(e.Return)
	}
	r.Drained = doneAt >= 0
	inFault := func(a, b int64) bool {
		for _, w := range faultWins {
			if w.end+int64(time.Second) >= a && w.start <= b {
				return true
			}
		}
		return false
	}

	// Produces.
	type prodInfo struct {
		attempts  int
		storing   int  // attempts that may have stored it
		mayStore  bool // some attempt may have written it
		firstCall int64
		landEnd   int64     // the last moment an attempt could have been written
		ok        []copyKey // 202'd places (a recreated topic's: inc 0 when not pinned)
		okRet     int64
		client    string
		batch     bool
		key       string
		// A recreated topic's incarnations the message may be in (any attempt that may
		// have been written) and the ones a 202'd attempt may be in.
		incs, incs202 map[int64]bool
	}
	prods := map[string]map[string]*prodInfo{} // topic → id → info
	place := map[copyKey]string{}              // one payload per (topic, partition, offset)
	var lat = map[string][]int64{}
	for i, e := range es {
		if e.Kind != history.KindOp {
			continue
		}
		if e.Status != 0 {
			lat[e.Op] = append(lat[e.Op], e.Return-e.Call)
			bound := int64(opBound)
			if e.Op == history.OpConsume {
				bound += int64(time.Second)
			}
			if e.Return-e.Call > bound && !inFault(e.Call, e.Return) {
				r.violate("op-past-bound", "line %d: %s %s took %s outside any fault", i+1, e.Op, e.Topic, ms(e.Return-e.Call))
			}
		} else if e.Return-e.Call > int64(opBound) && !inFault(e.Call, e.Return) {
			r.violate("op-past-bound", "line %d: %s %s had no answer after %s outside any fault (%s)", i+1, e.Op, e.Topic, ms(e.Return-e.Call), e.Err)
		}
		if e.Status >= 500 && e.Status != 503 || e.Code == "no_json_error_body" {
			r.violate("5xx-or-bad-error", "line %d: %s %s answered %d %s", i+1, e.Op, e.Topic, e.Status, e.Err)
		}
		if e.Status == 503 && (e.Code == "storage_failed" || e.Code == "maybe_stored") && !inFault(e.Call, e.Return) {
			r.violate("storage-failed-without-disk-fault", "line %d: %s %s: %s", i+1, e.Op, e.Topic, e.Err)
		}
		switch rec := recreated[e.Topic]; {
		case e.Op == history.OpCreateTopic || e.Op == history.OpDeleteTopic:
			if e.Status >= 400 && e.Status < 500 && e.Status != 404 && e.Status != 409 {
				r.violate("unexpected-4xx", "line %d: %s %s answered %s", i+1, e.Op, e.Topic, e.Err)
			}
		case rec != nil && e.Status == 404:
			// No topic of that name right now: legal unless one surely existed all along.
			if rec.surely(e.Call, e.Return) {
				r.violate("404-while-topic-exists", "line %d: %s %s answered 404 from %s to %s, while an incarnation surely existed", i+1, e.Op, e.Topic, ms(e.Call), ms(e.Return))
			}
		case e.Status >= 400 && e.Status < 500 && e.Status != 410 && e.Op != history.OpAdmin:
			r.violate("unexpected-4xx", "line %d: %s %s answered %s", i+1, e.Op, e.Topic, e.Err)
		}
		if e.Op != history.OpProduce {
			continue
		}
		r.Produced++
		m := prods[e.Topic]
		if m == nil {
			m = map[string]*prodInfo{}
			prods[e.Topic] = m
		}
		p := m[e.Msg]
		if p == nil {
			p = &prodInfo{firstCall: e.Call, client: e.Client, batch: e.Batch, key: e.Key, incs: map[int64]bool{}, incs202: map[int64]bool{}}
			m[e.Msg] = p
		}
		p.attempts++
		stored := produceMayHaveStored(e)
		if cluster {
			stored = clusterProduceMayHaveStored(e)
		}
		if stored {
			p.storing++
		}
		p.mayStore = p.mayStore || stored
		if stored {
			p.landEnd = max(p.landEnd, landEnd(e))
		}
		var inc int64
		if rec := recreated[e.Topic]; rec != nil && stored {
			// The incarnations that existed at some moment the attempt could have been
			// written in: one pins it.
			cands := rec.during(e.Call, landEnd(e))
			for _, c := range cands {
				p.incs[c] = true
				if e.Status == 202 {
					p.incs202[c] = true
				}
			}
			if len(cands) == 1 {
				inc = cands[0]
			}
		}
		if e.Status == 202 {
			k := copyKey{e.Topic, inc, e.Partition, e.Offset}
			if recreated[e.Topic] == nil || inc != 0 {
				if prev, ok := place[k]; ok && prev != e.Msg {
					r.violate("two-payloads-at-one-offset", "%s answered 202 for %s and for %s", k, prev, e.Msg)
				}
				place[k] = e.Msg
			}
			p.ok = append(p.ok, k)
			p.okRet = e.Return
			if len(p.ok) == 1 {
				r.Messages++
				r.MessagesByTopic[e.Topic]++
			}
		}
	}
	for op, l := range lat {
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		r.Latency[op] = [2]string{ms(l[len(l)/2]), ms(l[len(l)*99/100])}
	}

	// Deliveries and settles, per copy.
	type deliv struct {
		e    history.Entry
		line int
	}
	delivs := map[string]map[string][]deliv{} // topic → id → deliveries
	reads := map[string]map[string][]deliv{}  // topic → id → replays (no lease)
	copyOps := map[copyKey][]opIn{}
	parentTS := map[string]int64{} // id → smallest parent timestamp seen
	for i, e := range es {
		if e.Kind != history.KindOp {
			continue
		}
		k := copyKey{e.Topic, incOf(e), e.Partition, e.Offset}
		switch e.Op {
		case history.OpConsume:
			if e.Msg == "" || e.Status != 200 {
				continue
			}
			r.Deliveries++
			if delivs[e.Topic] == nil {
				delivs[e.Topic] = map[string][]deliv{}
			}
			delivs[e.Topic][e.Msg] = append(delivs[e.Topic][e.Msg], deliv{e, i + 1})
			if prev, ok := place[k]; ok && prev != e.Msg {
				r.violate("two-payloads-at-one-offset", "line %d: %s delivered %s, but it holds %s", i+1, k, e.Msg, prev)
			}
			place[k] = e.Msg
			copyOps[k] = append(copyOps[k], opIn{kind: kDeliver, handle: e.Handle, call: e.Call, ret: e.Return, line: i + 1, client: e.Client})
			if e.Topic == "orders" {
				if ts, ok := parentTS[e.Msg]; !ok || e.Timestamp < ts {
					parentTS[e.Msg] = e.Timestamp
				}
			}
		case history.OpRead:
			if e.Msg == "" || e.Status != 200 {
				continue
			}
			r.Replayed++
			if prev, ok := place[k]; ok && prev != e.Msg {
				r.violate("two-payloads-at-one-offset", "line %d: %s replayed %s, but it holds %s", i+1, k, e.Msg, prev)
			}
			place[k] = e.Msg
			if reads[e.Topic] == nil {
				reads[e.Topic] = map[string][]deliv{}
			}
			reads[e.Topic][e.Msg] = append(reads[e.Topic][e.Msg], deliv{e, i + 1})
		case history.OpAck, history.OpNack, history.OpExtend:
			in := opIn{handle: e.Handle, call: e.Call, ret: e.Return, line: i + 1, client: e.Client}
			in.kind = map[string]opKind{history.OpAck: kAck, history.OpNack: kNack, history.OpExtend: kExtend}[e.Op]
			switch {
			case e.Status == 204:
				in.out = oOK
			case e.Status == 410:
				in.out = oGone
			case e.Status == 0 || e.Code == "timeout" || e.Code == "unavailable":
				in.out = oUnknown
			case e.Status == 503 && e.Code == "maybe_stored":
				in.out = oNotUndone
			case e.Status == 503 && e.Code == "storage_failed":
				in.out = oFailed
			default:
				in.out = oOther
			}
			copyOps[k] = append(copyOps[k], in)
		}
	}

	// In a cluster, the windows in which each partition surely changed leader.
	epochs, voiding := map[pkey]kills{}, map[pkey]kills{}
	if cluster {
		epochs, voiding = epochChanges(es, incOf)
	}

	// The porcupine model, copy by copy.
	keys := make([]copyKey, 0, len(copyOps))
	for k := range copyOps {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.topic != b.topic {
			return a.topic < b.topic
		}
		if a.partition != b.partition {
			return a.partition < b.partition
		}
		return a.offset < b.offset
	})
	for _, k := range keys {
		t := topics[k.topic]
		m := &model{vis: t.VisibilityMs * int64(time.Millisecond), kills: ks, agedAt: 1 << 62}
		if cluster {
			// A handover keeps the live leases: only the other changes of leader may
			// lose one (or void its handle).
			m.strictAck, m.changes = true, voiding[pkey{k.topic, k.inc, k.partition}]
			m.kills = append(append(kills(nil), ks...), m.changes...)
		}
		src := k.topic
		if t.Parent != "" {
			src = t.Parent
		}
		if p := prods[src][place[k]]; p != nil {
			// A forward clock step may age it out earlier (see clockTimeline.early).
			m.agedAt = p.firstCall + t.RetentionMs*int64(time.Millisecond) - clock.early(p.firstCall, p.landEnd, never)
		}
		if rec := recreated[k.topic]; rec != nil {
			// Deleting the incarnation ends its leases as aging out does.
			if w := rec.byInc[k.inc]; w != nil {
				m.agedAt = min(m.agedAt, w.diedMin)
			}
		}
		if ok, bad, why := m.checkCopy(copyOps[k]); !ok {
			if at, lost := settleLostAt(k.topic, k.partition, k.offset, "", firstAck(copyOps[k])); lost && !cluster {
				// Legal once a delivery after the damage may follow the ack: checked
				// again so, since the explanation below may blame another step.
				again := *m
				again.ackUndoneAt = at
				ok, abad, awhy := again.checkCopy(copyOps[k])
				if ok {
					r.SettleDamaged++
					continue
				}
				// The damage explains the ack's loss but not this history: what is wrong
				// with it even so is the violation.
				bad, why = abad, awhy
			}
			kind := "lease-model"
			switch {
			case strings.Contains(why, "after a 204 ack"):
				kind = "acked-redelivered"
			case strings.Contains(why, "surely alive") && bad.kind == kDeliver:
				kind = "delivered-under-live-lease"
			case strings.HasPrefix(why, "410"):
				kind = "410-on-live-lease"
			case strings.HasPrefix(why, "204") && strings.Contains(why, "change of the partition's leader"):
				kind = "204-on-old-leader-handle"
			case strings.HasPrefix(why, "204"):
				kind = "204-on-dead-lease"
			}
			r.violate(kind, "%s (%s): line %d %s by %s: %s", k, place[k], bad.line, bad.kind, bad.client, why)
		}
	}

	// Duplicates by cause.
	acked := map[string]*opIn{} // handle → its first 204 ack
	nacked := map[string]bool{}
	for _, ops := range copyOps {
		for i := range ops {
			o := &ops[i]
			switch {
			case o.kind == kAck && o.out == oOK:
				if acked[o.handle] == nil {
					acked[o.handle] = o
				}
			case o.kind == kNack && (o.out == oOK || o.out == oUnknown), o.kind == kAck && (o.out == oFailed || o.out == oNotUndone):
				nacked[o.handle] = true
			}
		}
	}
	anyKillBefore := func(t int64) bool {
		for _, w := range ks {
			if w[0] <= t {
				return true
			}
		}
		for _, ws := range epochs {
			for _, w := range ws {
				if w[0] <= t {
					return true
				}
			}
		}
		return false
	}
	for topic, byID := range delivs {
		t := topics[topic]
		vis := t.VisibilityMs * int64(time.Millisecond)
		src := topic
		if t.Parent != "" {
			src = t.Parent
		}
		for id, ds := range byID {
			sort.Slice(ds, func(i, j int) bool { return ds[i].e.Return < ds[j].e.Return })
			for j := 1; j < len(ds); j++ {
				cur := ds[j].e
				var prev *history.Entry
				for q := j - 1; q >= 0; q-- {
					if ds[q].e.Partition == cur.Partition && ds[q].e.Offset == cur.Offset && incOf(ds[q].e) == incOf(cur) {
						prev = &ds[q].e
						break
					}
				}
				cause := CauseNone
				pks := ks
				if cluster {
					pks = append(append(kills(nil), ks...), epochs[pkey{topic, incOf(cur), cur.Partition}]...)
				}
				switch {
				case prev == nil:
					p := prods[src][id]
					switch {
					case p != nil && p.attempts > 1 && (!cluster || p.storing > 1):
						cause = CauseAmbiguous
					case t.Parent != "" && anyKillBefore(cur.Return):
						cause = CauseKill // a fan-out batch copied again after a crash
						if cluster {
							// The parent's new leader copies again from its own cursor
							// (docs/internals/replication.md, not built yet: cursors are
							// not replicated), possibly the partition's whole history.
							cause = CauseFanoutRecopy
						}
					}
				case acked[prev.Handle] != nil && acked[prev.Handle].ret < cur.Call:
					if cluster {
						break // committed on a quorum: nothing excuses it (the lease model names it)
					}
					if a := acked[prev.Handle]; ks.between(a.call, a.ret) {
						cause = CauseKill
						r.AckedRedelivered++
					} else if settleLost(topic, cur.Partition, cur.Offset, id, a.call) {
						cause = CauseDamagedSettle
					}
				case nacked[prev.Handle]:
					cause = CauseNack
				case pks.between(prev.Call, cur.Return):
					cause = CauseKill
					if cluster {
						cause = CauseLeaderChange
					}
				case cur.Return+tolerance >= prev.Call+vis:
					cause = CauseLeaseLapse
				}
				r.Duplicates[cause]++
				if cause == CauseNone {
					r.violate("duplicate-without-cause", "line %d: %s delivered %s again (%s/%d@%d) with no lapse, nack, retry or kill to explain it", ds[j].line, topic, id, topic, cur.Partition, cur.Offset)
				}
			}
		}
	}

	// Unexpected: a delivery of something never produced there, or that no produce
	// attempt may have written (each was refused, or failed and was undone).
	for topic, byID := range delivs {
		t := topics[topic]
		src := topic
		if t.Parent != "" {
			src = t.Parent
		}
		for id, ds := range byID {
			p := prods[src][id]
			if p != nil && p.mayStore {
				continue
			}
			r.Unexpected++
			if r.Unexpected <= 5 {
				why := "never produced to " + src
				if p != nil {
					why = fmt.Sprintf("none of its %d produce attempts to %s may have stored it", p.attempts, src)
				}
				r.Examples = append(r.Examples, Violation{"unexpected", fmt.Sprintf("line %d: %s delivered %q, %s", ds[0].line, topic, id, why)})
			}
		}
	}

	// Replays: what a read returned was written by an attempt that may have stored it,
	// sent before the read answered.
	for topic, byID := range reads {
		src := topic
		if t := topics[topic]; t.Parent != "" {
			src = t.Parent
		}
		for id, rs := range byID {
			p := prods[src][id]
			if p == nil || !p.mayStore {
				r.Unexpected++
				if r.Unexpected <= 5 {
					r.Examples = append(r.Examples, Violation{"unexpected", fmt.Sprintf("line %d: %s replayed %q, which no produce attempt to %s may have stored", rs[0].line, topic, id, src)})
				}
				continue
			}
			for _, x := range rs {
				if x.e.Return < p.firstCall {
					r.violate("replayed-before-produced", "line %d: %s replayed %s at %s, before its first produce was sent (%s)", x.line, topic, id, ms(x.e.Return), ms(p.firstCall))
				}
			}
		}
	}

	// Delays never early.
	for _, t := range run.Topics {
		if t.DelayMs <= 0 {
			continue
		}
		d := t.DelayMs * int64(time.Millisecond)
		for id, ds := range delivs[t.Name] {
			p := prods[t.Parent][id]
			if p == nil {
				continue
			}
			for _, x := range ds {
				if x.e.Return+tolerance < p.firstCall+d {
					// Early by the run's clock: legal only within what forward clock steps
					// between the parent's stamp and this delivery explain.
					if allow := clock.early(p.firstCall, p.landEnd, x.e.Return); x.e.Return+tolerance+allow < p.firstCall+d {
						r.violate("delay-early", "line %d: %s delivered %s %s after its first produce was sent, before its %s delay (forward clock steps excuse %s)", x.line, t.Name, id, ms(x.e.Return-p.firstCall), ms(d), ms(allow))
					} else {
						r.earlyByClock(p.firstCall + d - x.e.Return)
					}
				}
				if ts, ok := parentTS[id]; ok && x.e.Timestamp+2 < ts+t.DelayMs {
					// The copy is stamped by the child's leader: in a cluster whose clocks
					// differ, it may run behind the node whose clock decided the copy, and
					// it stamps later than the parent was stamped, up to the delivery: a
					// node behind and drifting further back (or stepped back since) does
					// so by more than its offset during the parent's stamping. Any two
					// offsets of [produce, delivery] may meet there (TestClockSteps; a
					// cluster run once flagged copies 5 ms beyond early's allowance, stamped
					// by a node stepped back 10 s and drifting back 20 ms a second).
					lo, hi := clock.span(p.firstCall, x.e.Return)
					if allow := max(clock.early(p.firstCall, p.landEnd, x.e.Return), hi-lo) / int64(time.Millisecond); x.e.Timestamp+2+allow < ts+t.DelayMs {
						r.violate("delay-early", "line %d: %s copy of %s stamped %d, parent stamped %d: %d ms apart, delay %d ms (clock offsets excuse %d ms)", x.line, t.Name, id, x.e.Timestamp, ts, x.e.Timestamp-ts, t.DelayMs, allow)
					}
				}
			}
		}
	}

	// Markers: per partition, never backwards; high watermark past every 202'd offset;
	// nothing deleted younger than the retention.
	samples := map[pkey][]history.Entry{}
	hurt := hurtWindows(es)
	for _, e := range es {
		if e.Kind == history.KindStats {
			if cluster && hurt.during(e.Node, e.Call, e.Return) {
				// Read through a node that was paused or cut off (or just back): it may
				// still believe it leads, and answer from its stale replica.
				r.StaleSamples++
				continue
			}
			k := pkey{e.Topic, incOf(e), e.Partition}
			samples[k] = append(samples[k], e)
		}
	}
	for k, ss := range samples {
		// Sorted by return; every sample must show markers at least as high as the
		// highest of the samples that finished before it was sent.
		sort.Slice(ss, func(i, j int) bool { return ss[i].Return < ss[j].Return })
		byCall := append([]history.Entry(nil), ss...)
		sort.Slice(byCall, func(i, j int) bool { return byCall[i].Call < byCall[j].Call })
		var hw, fr, old history.Entry
		seen := false
		q := 0
		for _, s := range byCall {
			for ; q < len(ss) && ss[q].Return < s.Call; q++ {
				if !seen || ss[q].HighWatermark > hw.HighWatermark {
					hw = ss[q]
				}
				if !seen || ss[q].Frontier > fr.Frontier {
					fr = ss[q]
				}
				if !seen || ss[q].Oldest > old.Oldest {
					old = ss[q]
				}
				seen = true
			}
			if seen {
				if s.HighWatermark < hw.HighWatermark {
					r.violate("high-watermark-backwards", "%s/%d: %d at %s after %d at %s", k.name(), k.p, s.HighWatermark, ms(s.Call), hw.HighWatermark, ms(hw.Return))
				}
				if s.Frontier < fr.Frontier && settleLost(k.topic, k.p, s.Frontier, "", 0) {
					// A damaged settle record undid acks: the frontier may go back to the
					// first message it settled, and counts from there.
					fr = s
				} else if s.Frontier < fr.Frontier {
					r.violate("frontier-backwards", "%s/%d: %d at %s after %d at %s", k.name(), k.p, s.Frontier, ms(s.Call), fr.Frontier, ms(fr.Return))
				}
				if s.Oldest < old.Oldest {
					r.violate("oldest-backwards", "%s/%d: %d at %s after %d at %s", k.name(), k.p, s.Oldest, ms(s.Call), old.Oldest, ms(old.Return))
				}
			}
			if s.HighWatermark > s.Offset {
				r.violate("high-watermark-past-log-end", "%s/%d: high watermark %d, next offset %d", k.name(), k.p, s.HighWatermark, s.Offset)
			}
		}
		samples[k] = byCall
	}
	// firstAfter returns the first sample of a partition sent after t.
	firstAfter := func(k pkey, t int64) (history.Entry, bool) {
		ss := samples[k]
		i := sort.Search(len(ss), func(i int) bool { return ss[i].Call > t })
		if i == len(ss) {
			return history.Entry{}, false
		}
		return ss[i], true
	}
	// deletedBy returns the first sample showing offset off deleted (oldest past it).
	deletedBy := func(k pkey, off int64) (history.Entry, bool) {
		ss := samples[k] // oldest never goes back (checked above), so search
		i := sort.Search(len(ss), func(i int) bool { return ss[i].Oldest > off })
		if i == len(ss) {
			return history.Entry{}, false
		}
		return ss[i], true
	}
	for topic, m := range prods {
		ret := topics[topic].RetentionMs * int64(time.Millisecond)
		for id, p := range m {
			for _, c := range p.ok {
				if recreated[topic] != nil && c.inc == 0 {
					continue // not pinned to one incarnation
				}
				k := pkey{topic, c.inc, c.partition}
				if s, ok := firstAfter(k, p.okRet); ok && s.HighWatermark <= c.offset {
					r.violate("202-not-below-high-watermark", "%s at %s answered 202 at %s; high watermark %d at %s", id, c, ms(p.okRet), s.HighWatermark, ms(s.Call))
				}
				if s, ok := deletedBy(k, c.offset); ok && s.Return+tolerance < p.firstCall+ret {
					if allow := clock.early(p.firstCall, p.landEnd, s.Return); s.Return+tolerance+allow < p.firstCall+ret {
						r.violate("retention-early", "%s at %s was deleted by %s, %s after its produce; retention %s (forward clock steps excuse %s)", id, c, ms(s.Return), ms(s.Return-p.firstCall), ms(ret), ms(allow))
					} else {
						r.earlyByClock(p.firstCall + ret - s.Return)
					}
				}
			}
		}
	}

	// Lost: every 202'd message delivered in its topic and in every child of it.
	deletedBelow := func(topic string, c copyKey) bool {
		_, ok := deletedBy(pkey{topic, c.inc, c.partition}, c.offset)
		return ok
	}
	for _, t := range run.Topics {
		src := t.Name
		if t.Parent != "" {
			src = t.Parent
		}
		for id, p := range prods[src] {
			if len(p.ok) == 0 || len(delivs[t.Name][id]) > 0 {
				continue
			}
			if t.Parent == "" && len(p.ok) > 0 && deletedBelow(t.Name, p.ok[0]) {
				r.AgedOut++
				continue
			}
			if rec := recreated[t.Name]; rec != nil && droppedWith(rec, p.incs202) {
				r.DroppedWithTopic++
				continue
			}
			skipped := false
			for _, k := range damagedMsgID[[2]string{t.Name, id}] {
				skipped = skipped || skippedMsg[k]
			}
			if t.Parent != "" {
				// A child never gets a copy of a parent record the copier skipped as damaged.
				for _, k := range damagedMsgID[[2]string{src, id}] {
					skipped = skipped || skippedCopy[k][t.Name]
				}
			}
			if skipped {
				r.DamagedSkipped++
				continue
			}
			r.Lost[t.Name]++
			if len(r.LostIDs) < 20 {
				r.LostIDs = append(r.LostIDs, t.Name+":"+id)
			}
			if r.Lost[t.Name] <= 5 {
				kind := "lost"
				if t.Parent != "" {
					kind = "fan-out-gap"
				}
				r.Examples = append(r.Examples, Violation{kind, fmt.Sprintf("%s never delivered %s (202 at %s for %v)", t.Name, id, ms(p.okRet), p.ok)})
			}
		}
	}
	if drainAt < 0 || doneAt < 0 {
		r.violate("incomplete-history", "the history has no drain or no end: the run stopped early")
	}

	// Log order: one producer's single produces of one key land in its partition in order.
	type order struct {
		topic       string
		client, key string
		inc         int64
		p           int32
	}
	last := map[order]int64{}
	for _, e := range es {
		if e.Kind == history.KindOp && e.Op == history.OpProduce && e.Status == 202 && !e.Batch && e.Key != "" {
			var inc int64
			if rec := recreated[e.Topic]; rec != nil {
				if cands := rec.during(e.Call, e.Return); len(cands) == 1 {
					inc = cands[0]
				} else {
					continue
				}
			}
			o := order{e.Topic, e.Client, e.Key, inc, e.Partition}
			if prev, ok := last[o]; ok && e.Offset <= prev && len(prods[e.Topic][e.Msg].ok) == 1 {
				r.violate("log-order", "%s's %s (key %s) got offset %d after an earlier message got %d", e.Client, e.Msg, e.Key, e.Offset, prev)
			}
			last[o] = e.Offset
		}
	}

	if cluster {
		checkReplicas(r, es, place, recreated)
	}
	r.Availability = availability(es)
	checkTimestamps(r, es, incOf)
	checkIncarnations(r, es, recreated, topics, func(topic, id string) map[int64]bool {
		if p := prods[topic][id]; p != nil {
			return p.incs
		}
		return nil
	})
	return r
}

// pkey is one partition of one incarnation (0 for topics that are not recreated).
type pkey struct {
	topic string
	inc   int64
	p     int32
}

func (k pkey) name() string {
	if k.inc != 0 {
		return fmt.Sprintf("%s#%d", k.topic, k.inc)
	}
	return k.topic
}

func fmtOffset(ns int64) string {
	d := time.Duration(ns).Round(time.Millisecond) // a drifted offset has nanoseconds
	if d > 0 {
		return "+" + d.String()
	}
	return d.String()
}

// droppedWith reports whether a 202'd message may be in an incarnation that was deleted:
// deleting a topic drops its messages, so one never delivered is not lost.
func droppedWith(rec *incSet, incs map[int64]bool) bool {
	for inc := range incs {
		if w := rec.byInc[inc]; w != nil && w.diedMin < never {
			return true
		}
	}
	return false
}

// checkTimestamps: a partition's records never go back in time — the timestamps of its
// deliveries never decrease with the offset (the broker clamps a stamp to the
// partition's last one, so neither a clock step across a restart nor anything else may
// lower it), and one offset always shows one timestamp.
func checkTimestamps(r *Report, es []history.Entry, incOf func(history.Entry) int64) {
	type at struct {
		ts   int64
		line int
	}
	byPart := map[pkey]map[int64]at{}
	for i, e := range es {
		if e.Kind != history.KindOp || e.Op != history.OpConsume || e.Status != 200 || e.Msg == "" || e.Timestamp == 0 {
			continue
		}
		k := pkey{e.Topic, incOf(e), e.Partition}
		m := byPart[k]
		if m == nil {
			m = map[int64]at{}
			byPart[k] = m
		}
		if prev, ok := m[e.Offset]; ok {
			if prev.ts != e.Timestamp {
				r.violate("timestamp-changed", "line %d: %s/%d@%d delivered stamped %d, line %d stamped %d", i+1, k.name(), k.p, e.Offset, e.Timestamp, prev.line, prev.ts)
			}
			continue
		}
		m[e.Offset] = at{e.Timestamp, i + 1}
	}
	keys := make([]pkey, 0, len(byPart))
	for k := range byPart {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.topic != b.topic {
			return a.topic < b.topic
		}
		if a.inc != b.inc {
			return a.inc < b.inc
		}
		return a.p < b.p
	})
	for _, k := range keys {
		m := byPart[k]
		offs := make([]int64, 0, len(m))
		for o := range m {
			offs = append(offs, o)
		}
		sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
		for i := 1; i < len(offs); i++ {
			a, b := m[offs[i-1]], m[offs[i]]
			if b.ts < a.ts {
				r.violate("timestamp-backwards", "%s/%d: offset %d (line %d) stamped %d, %d ms before offset %d (line %d) stamped %d",
					k.name(), k.p, offs[i], b.line, b.ts, a.ts-b.ts, offs[i-1], a.line, a.ts)
			}
		}
	}
}

// checkIncarnations: nothing of one incarnation of a recreated topic appears in another.
//   - Every delivery's handle names an incarnation that may have existed during the
//     consume, and one the message may have been written to (incs: by the times of its
//     produce attempts; a produce racing a delete may be in either incarnation).
//   - A settle (ack, renew, nack) with a handle of an incarnation surely deleted before
//     it was sent never answers 204: it answers 404 or 410.
//
// A delivery whose handle does not decode fails the check: the incarnation could not be
// told, and offsets repeat across incarnations.
func checkIncarnations(r *Report, es []history.Entry, recreated map[string]*incSet, topics map[string]history.TopicInfo, incs func(topic, id string) map[int64]bool) {
	// Topics that are not recreated keep one incarnation, across restarts too.
	one := map[string]int64{}
	for i, e := range es {
		if recreated[e.Topic] != nil || e.Incarnation == 0 || (e.Kind != history.KindStats && (e.Kind != history.KindOp || e.Op != history.OpConsume)) {
			continue
		}
		if prev, ok := one[e.Topic]; ok && prev != e.Incarnation {
			r.violate("incarnation-changed", "line %d: %s shows incarnation %d, earlier %d, and was never deleted", i+1, e.Topic, e.Incarnation, prev)
		}
		one[e.Topic] = e.Incarnation
	}
	for i, e := range es {
		rec := recreated[e.Topic]
		if rec == nil || e.Kind != history.KindOp {
			continue
		}
		h := e.Incarnation
		switch e.Op {
		case history.OpConsume:
			if e.Status != 200 || e.Msg == "" {
				continue
			}
			if h == 0 {
				r.violate("handle-incarnation-unreadable", "line %d: %s delivered %s with a receipt handle whose incarnation cannot be read (%q)", i+1, e.Topic, e.Msg, e.Handle)
				continue
			}
			w := rec.byInc[h]
			switch {
			case w == nil:
				r.violate("delivery-from-unknown-incarnation", "line %d: %s delivered %s with a handle of incarnation %d, which no create or read of the topic showed", i+1, e.Topic, e.Msg, h)
				continue
			case w.bornMin > e.Return || w.diedSure < e.Call:
				r.violate("delivery-from-dead-incarnation", "line %d: %s delivered %s from %s to %s with a handle of incarnation %d, which existed from %s at the earliest to %s at the latest",
					i+1, e.Topic, e.Msg, ms(e.Call), ms(e.Return), h, ms(w.bornMin), msOrNever(w.diedSure))
			}
			in := incs(e.Topic, e.Msg)
			if len(in) == 0 || in[h] {
				continue // never produced here (counted as unexpected), or where it was written
			}
			var names []string
			older := true
			for c := range in {
				names = append(names, fmt.Sprint(c))
				older = older && c < h
			}
			sort.Strings(names)
			kind := "incarnation-crossed"
			if older {
				kind = "old-incarnation-delivered"
			}
			r.violate(kind, "line %d: %s delivered %s (%s/%d@%d) under incarnation %d; its produce attempts could only have written it to incarnation %s",
				i+1, e.Topic, e.Msg, e.Topic, e.Partition, e.Offset, h, strings.Join(names, " or "))
		case history.OpAck, history.OpNack, history.OpExtend:
			if e.Status != 204 || h == 0 {
				continue
			}
			if w := rec.byInc[h]; w != nil && e.Call > w.diedSure {
				r.violate("stale-handle-settled", "line %d: %s on %s with a handle of incarnation %d answered 204 at %s; that incarnation was deleted by %s",
					i+1, e.Op, e.Topic, h, ms(e.Return), ms(w.diedSure))
			}
		}
	}
}

func msOrNever(t int64) string {
	if t >= never {
		return "never"
	}
	return ms(t)
}

// partlyStored reports whether a batch's 503 says only part of the batch was stored:
// some partitions' writes succeeded while others failed.
func partlyStored(e history.Entry) bool {
	return strings.Contains(e.Err, "part of the batch was stored")
}

// produceMayHaveStored reports whether a produce attempt may have written its message:
// a 202, no answer, or a 5xx. A 503 storage_failed stored nothing (the broker undid the
// failed write; one it could not undo is a 503 maybe_stored), unless, for a batch, it
// says that part of the batch was stored (the message names the failed partitions, not
// the messages, so every message of such a batch may be stored).
func produceMayHaveStored(e history.Entry) bool {
	switch {
	case e.Status == 0 || e.Status == 202:
		return true
	case e.Status == 503 && e.Code == "storage_failed":
		return e.Batch && partlyStored(e)
	case e.Status == 404:
		// A batch whose topic was deleted while it was written, part of it stored.
		return e.Batch && partlyStored(e)
	}
	return e.Status >= 500
}

// withUnansweredIntents returns es with a produce line for every message an intent line
// announced and no produce line of the same client, topic, message and attempt
// answered: the run died (or was stopped) while it was on its way, so it was sent
// without an answer, which may have stored it. Its end is the history's last moment.
func withUnansweredIntents(es []history.Entry) []history.Entry {
	type key struct {
		client, topic, msg string
		attempt            int
	}
	answered := map[key]bool{}
	var last int64
	intents := 0
	for _, e := range es {
		last = max(last, e.Call, e.Return)
		switch {
		case e.Kind == history.KindIntent:
			intents++
		case e.Kind == history.KindOp && e.Op == history.OpProduce:
			answered[key{e.Client, e.Topic, e.Msg, e.Attempt}] = true
		}
	}
	if intents == 0 {
		return es
	}
	out := make([]history.Entry, 0, len(es))
	for _, e := range es {
		if e.Kind != history.KindIntent {
			out = append(out, e)
			continue
		}
		ids := e.IDs
		if e.Msg != "" {
			ids = []string{e.Msg}
		}
		for _, id := range ids {
			if !answered[key{e.Client, e.Topic, id, e.Attempt}] {
				out = append(out, history.Entry{Kind: history.KindOp, Client: e.Client, Op: history.OpProduce, Topic: e.Topic, Msg: id,
					Attempt: e.Attempt, Batch: e.Batch, Call: e.Call, Return: last, Partition: -1, Offset: -1,
					Err: "sent; the run ended before its answer was recorded"})
			}
		}
	}
	return out
}
