package check

import (
	"fmt"
	"sort"
	"time"

	"github.com/narad-mq/narad/verify/history"
)

// Doctor edits a real history the way a broker bug would show in it, so a test (or a
// person with the CLI) can see the checker catch it:
//
//   - acked-redelivery: a message acked with 204 is delivered once more, a second
//     after the end of the history's last fault (outside every kill window);
//   - lost: every delivery of one 202'd parent message is removed, with its settles;
//   - live-lease: a message is delivered to a second consumer 1 ms after the first
//     delivery returned, under the first one's live lease.
func Doctor(es []history.Entry, kind string) ([]history.Entry, string, error) {
	out := append([]history.Entry(nil), es...)
	lastFault, end := int64(0), int64(0)
	for _, e := range es {
		if e.Kind == history.KindFault && e.Return > lastFault {
			lastFault = e.Return
		}
		end = max(end, e.Return, e.Call)
	}
	switch kind {
	case "acked-redelivery":
		for _, e := range es {
			if e.Kind == history.KindOp && e.Op == history.OpAck && e.Status == 204 && e.Topic == "orders" {
				d := history.Entry{Kind: history.KindOp, Client: "doctor", Op: history.OpConsume, Topic: e.Topic, Partition: e.Partition,
					Offset: e.Offset, Msg: e.Msg, Status: 200, Handle: "doctored", Call: max(lastFault, e.Return) + int64(time.Second)}
				d.Return = d.Call + int64(time.Millisecond)
				out = append(out, d)
				return out, fmt.Sprintf("%s (orders/%d@%d), acked at %s, delivered again at %s", e.Msg, e.Partition, e.Offset, ms(e.Return), ms(d.Call)), nil
			}
		}
	case "lost":
		for _, e := range es {
			if e.Kind == history.KindOp && e.Op == history.OpProduce && e.Status == 202 && e.Topic == "orders" {
				kept := out[:0]
				for _, x := range out {
					if x.Kind == history.KindOp && x.Topic == "orders" && x.Msg == e.Msg && x.Op != history.OpProduce {
						continue
					}
					kept = append(kept, x)
				}
				return kept, fmt.Sprintf("every delivery of %s in orders removed (202 at orders/%d@%d)", e.Msg, e.Partition, e.Offset), nil
			}
		}
	case "live-lease":
		// A delivery whose lease nobody settles within 100 ms, so the doctored second
		// delivery falls inside a lease that is surely alive and surely unsettled.
		settled := map[string]int64{}
		for _, e := range es {
			if e.Kind == history.KindOp && e.Handle != "" && (e.Op == history.OpAck || e.Op == history.OpNack || e.Op == history.OpExtend) {
				if t, ok := settled[e.Handle]; !ok || e.Call < t {
					settled[e.Handle] = e.Call
				}
			}
		}
		var ds []history.Entry
		for _, e := range es {
			if e.Kind == history.KindOp && e.Op == history.OpConsume && e.Status == 200 && e.Msg != "" && e.Topic == "orders" {
				if t, ok := settled[e.Handle]; !ok || t > e.Return+100*int64(time.Millisecond) {
					ds = append(ds, e)
				}
			}
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i].Call < ds[j].Call })
		if len(ds) > 0 {
			e := ds[len(ds)/2]
			d := e
			d.Client, d.Handle, d.Call, d.Return = "doctor", "doctored", e.Return+int64(time.Millisecond), e.Return+2*int64(time.Millisecond)
			out = append(out, d)
			return out, fmt.Sprintf("%s (orders/%d@%d) delivered again 1 ms after its delivery at %s", e.Msg, e.Partition, e.Offset, ms(e.Return)), nil
		}
	default:
		return nil, "", fmt.Errorf("unknown kind %q", kind)
	}
	return nil, "", fmt.Errorf("the history has nothing to doctor for %s", kind)
}
