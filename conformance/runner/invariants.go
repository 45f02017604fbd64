package runner

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"
)

// invariantChecks are the checks a scenario can run over its whole recorded history.
var invariantChecks = map[string]func(r *run, args any) error{
	"all_requests":              allRequests,
	"max_deliveries":            maxDeliveries,
	"fetch_within_free_workers": fetchWithinFreeWorkers,
	"no_ack_after_lease_lost":   noAckAfterLeaseLost,
	"no_requests_after_mark":    noRequestsAfterMark,
	"no_event":                  noEventEver,
	"renewals_within":           renewalsWithin,
	"no_delivery_after_ack":     noDeliveryAfterAck,
}

// no_delivery_after_ack: {} — a message the broker acked with 204 is never leased
// again by a poll that started after that answer: 204 means settled for good, across a
// change of partition leader too (the delivery contract; a broker finding, not an SDK
// one, when it fails). Single acks only (the consume loops settle one by one). At least
// one ack must have been answered 204.
func noDeliveryAfterAck(r *run, args any) error {
	exs := r.hist.Exchanges()
	type key struct {
		topic     string
		partition int64
		offset    int64
	}
	byHandle := map[string]key{}
	for _, ex := range exs {
		for _, g := range ex.Grants {
			byHandle[g.Handle] = key{g.Topic, g.Partition, g.Offset}
		}
	}
	acked := map[key]time.Time{} // the earliest 204 for each message
	for _, ex := range exs {
		if ex.Upstream != http.StatusNoContent || !strings.HasSuffix(ex.Path, "/ack") {
			continue
		}
		for _, s := range ex.Settles() {
			k, ok := byHandle[s.Handle]
			if !ok || s.HasExtend {
				continue
			}
			if at, seen := acked[k]; !seen || ex.End.Before(at) {
				acked[k] = ex.End
			}
		}
	}
	if len(acked) == 0 {
		return fmt.Errorf("no ack was answered 204, so there is nothing to check")
	}
	for _, ex := range exs {
		for _, g := range ex.Grants {
			k := key{g.Topic, g.Partition, g.Offset}
			if at, ok := acked[k]; ok && ex.Start.After(at) {
				return fmt.Errorf("%s partition %d offset %d was acked with 204 at %.3fs and leased again (attempt %d) by a poll started at %.3fs",
					g.Topic, g.Partition, g.Offset, at.Sub(r.t0).Seconds(), g.Attempt, ex.Start.Sub(r.t0).Seconds())
			}
		}
	}
	return nil
}

// all_requests: {where: <subset>, match: <subset>} — every exchange selected by where
// matches match.
func allRequests(r *run, args any) error {
	m := argMap(args)
	views, _ := r.selected(m["where"], time.Time{}, time.Time{})
	if len(views) == 0 {
		return fmt.Errorf("no request matches %s", show(m["where"]))
	}
	for i, v := range views {
		if err := Match(m["match"], v); err != nil {
			return fmt.Errorf("request %d (%v %v): %v", i, v["method"], v["path"], err)
		}
	}
	return nil
}

// max_deliveries: {max: N} — no message was leased more than N times.
func maxDeliveries(r *run, args any) error {
	m := argMap(args)
	limit, _ := m["max"].(float64)
	count := map[string]int{}
	for _, ex := range r.hist.Exchanges() {
		for _, g := range ex.Grants {
			count[fmt.Sprintf("%s/%d@%d", g.Topic, g.Partition, g.Offset)]++
		}
	}
	var bad []string
	for k, n := range count {
		if float64(n) > limit {
			bad = append(bad, fmt.Sprintf("%s leased %d times", k, n))
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		return fmt.Errorf("%s (at most %v allowed)", strings.Join(bad, ", "), limit)
	}
	return nil
}

// fetch_within_free_workers: {concurrency: N} — when a poll starts, the leases held
// (granted and not yet given a final settlement request) plus the messages the poll
// asks for never exceed the worker count (SDK contract rule 1). A lease counts as held until
// its last ack-family request starts.
func fetchWithinFreeWorkers(r *run, args any) error {
	m := argMap(args)
	conc, _ := m["concurrency"].(float64)
	exs := r.hist.Exchanges()
	type lease struct {
		granted time.Time
		last    time.Time
	}
	leases := map[string]*lease{}
	for _, ex := range exs {
		for _, g := range ex.Grants {
			leases[g.Handle] = &lease{granted: ex.End}
		}
	}
	for _, ex := range exs {
		for _, s := range ex.Settles() {
			if l := leases[s.Handle]; l != nil && ex.Start.After(l.last) {
				l.last = ex.Start
			}
		}
	}
	for _, ex := range exs {
		if !ex.IsPoll() {
			continue
		}
		ask := 1
		if strings.HasSuffix(ex.Path, "/consume-batch") {
			ask = atoiDefault(ex.Query["max"], 10)
		}
		held := 0
		for _, l := range leases {
			if l.granted.Before(ex.Start) && (l.last.IsZero() || l.last.After(ex.Start)) {
				held++
			}
		}
		if float64(held+ask) > conc {
			return fmt.Errorf("a poll at %.3fs asked for %d while %d leases were held; concurrency is %v",
				ex.Start.Sub(r.t0).Seconds(), ask, held, conc)
		}
	}
	return nil
}

// no_ack_after_lease_lost: {} — a message whose lease the SDK reported lost (a
// handler cancelled for that reason, or a lease_lost event that names the delivery
// attempt) is never acked with the handle of that delivery: the SDK must not settle
// work it no longer owns (SDK contract rule 1). The delivery is found by its receipt
// handle when the driver reports it, else by partition, offset and delivery attempt
// (the first such grant), never by time: a driver's event may reach the runner after
// the proxy recorded the redelivery.
func noAckAfterLeaseLost(r *run, args any) error {
	evs, _ := r.drv.Events()
	exs := r.hist.Exchanges()
	checked := 0
	for _, ev := range evs {
		lost := ev.Name == "lease_lost" || (ev.Name == "handled" && ev.Data["cancel_reason"] == "lease_lost")
		if !lost {
			continue
		}
		msg, _ := ev.Data["message"].(map[string]any)
		if msg == nil {
			msg = ev.Data
		}
		p, _ := msg["partition"].(float64)
		o, _ := msg["offset"].(float64)
		handle, _ := msg["receipt_handle"].(string)
		attempt, ok := msg["delivery_attempt"].(float64)
		if !ok {
			attempt, ok = ev.Data["delivery_attempt"].(float64)
		}
		if handle == "" && !ok {
			continue
		}
		if handle == "" {
			// Without the handle: the delivery with that attempt. After a change of
			// leader an attempt number can come twice; the lost one is the first.
			for _, ex := range exs {
				for _, g := range ex.Grants {
					if handle == "" && float64(g.Partition) == p && float64(g.Offset) == o && float64(g.Attempt) == attempt {
						handle = g.Handle
					}
				}
			}
		}
		if handle == "" {
			continue
		}
		checked++
		for _, ex := range exs {
			for _, s := range ex.Settles() {
				if s.Handle == handle && !s.HasExtend {
					return fmt.Errorf("partition %v offset %v attempt %v: its lost lease was acked at %.3fs (%s %s)", p, o, attempt,
						ex.Start.Sub(r.t0).Seconds(), ex.Method, ex.Path)
				}
			}
		}
	}
	if checked == 0 {
		return fmt.Errorf("no lost lease was reported with its delivery, so there is nothing to check")
	}
	return nil
}

// no_requests_after_mark: {mark: name, where: <subset>} — nothing selected by where
// started after the mark (a stopped consumer polls no more).
func noRequestsAfterMark(r *run, args any) error {
	m := argMap(args)
	name, _ := m["mark"].(string)
	at, ok := r.marks[name]
	if !ok {
		return fmt.Errorf("no mark %q", name)
	}
	if views, _ := r.selected(m["where"], at, time.Time{}); len(views) > 0 {
		return fmt.Errorf("after %s: %s", name, summarize(views))
	}
	return nil
}

// no_event: {event: name, match: <subset>} — the driver never reported such an event.
func noEventEver(r *run, args any) error {
	m := argMap(args)
	name, _ := m["event"].(string)
	if got := r.matchingEvents(name, m["match"], time.Time{}); len(got) > 0 {
		return fmt.Errorf("unwanted %q event(s): %s", name, show(got))
	}
	return nil
}

// renewals_within: {window_ms: W, fraction: F, slack_ms: S} — for every lease that was
// renewed, the time from the grant to the first renewal, between renewals, and from
// the last renewal to the settlement stays under F×W plus S (SDK contract rule 1: renew
// before two thirds of the window). At least one lease must have been renewed.
func renewalsWithin(r *run, args any) error {
	m := argMap(args)
	window, _ := m["window_ms"].(float64)
	fraction, _ := m["fraction"].(float64)
	slack, _ := m["slack_ms"].(float64)
	limit := time.Duration((window*fraction + slack) * float64(time.Millisecond))
	exs := r.hist.Exchanges()
	grants := map[string]time.Time{}
	for _, ex := range exs {
		for _, g := range ex.Grants {
			grants[g.Handle] = ex.End
		}
	}
	times := map[string][]time.Time{}
	renewed := 0
	for _, ex := range exs {
		for _, s := range ex.Settles() {
			if _, ok := grants[s.Handle]; ok {
				times[s.Handle] = append(times[s.Handle], ex.Start)
				if s.HasExtend && s.Extend != "0" {
					renewed++
				}
			}
		}
	}
	if renewed == 0 {
		return fmt.Errorf("no lease was renewed")
	}
	for h, ts := range times {
		prev := grants[h]
		for _, t := range ts {
			if gap := t.Sub(prev); gap > limit {
				return fmt.Errorf("lease %s: %v passed between a grant or renewal and the next request for it (limit %v)", h, gap.Round(time.Millisecond), limit)
			}
			prev = t
		}
	}
	return nil
}
