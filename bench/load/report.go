package load

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
	"unicode/utf8"
)

// Machine describes where a run happened, measured in the same run.
type Machine struct {
	CPUs int `json:"cpus"`
	// FsyncRate is 256-byte write + fsync per second on the benchmark's temp dir.
	FsyncRate float64 `json:"fsync_per_s"`
	// LoadStart and LoadEnd are /proc/loadavg at the start and the end of the run.
	LoadStart string `json:"loadavg_start"`
	LoadEnd   string `json:"loadavg_end"`
}

// Report is everything a run measured; it is what --json writes.
type Report struct {
	Started time.Time `json:"started"`
	Machine Machine   `json:"machine"`
	Options Options   `json:"options"`
	Results []Result  `json:"results"`
}

// FsyncRate measures the disk under dir: 256-byte writes each followed by fsync,
// for d. It returns 0 when the probe file cannot be written.
func FsyncRate(dir string, d time.Duration) float64 {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return 0
	}
	defer func() { _ = os.Remove(f.Name()) }() // a probe file in a temp dir
	defer func() { _ = f.Close() }()           // a probe: only the fsync timings matter
	buf := make([]byte, 256)
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		if _, err := f.Write(buf); err != nil {
			return 0
		}
		if err := f.Sync(); err != nil {
			return 0
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds()
}

// LoadAvg is the first three fields of /proc/loadavg, or "?" off Linux.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// NewMachine measures the machine: CPUs, load average, and the fsync rate of dir
// over probe.
func NewMachine(dir string, probe time.Duration) Machine {
	return Machine{CPUs: runtime.NumCPU(), LoadStart: LoadAvg(), FsyncRate: FsyncRate(dir, probe)}
}

func (m Machine) String() string {
	return fmt.Sprintf("machine: %d CPUs, load average %s, fsync rate %.0f/s (256-byte write + fsync in %s)",
		m.CPUs, m.LoadStart, m.FsyncRate, filepath.Clean(os.TempDir()))
}

// WriteJSON writes the report, indented, to path.
func (r Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ms formats a duration in milliseconds with three significant figures or so.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v < 1:
		return fmt.Sprintf("%.3f", v)
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func count(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func shapeLabel(r Result) string {
	switch r.Shape {
	case ShapeBatch:
		return "batch"
	case ShapeLatency, ShapeWakeup:
		return fmt.Sprintf("%s@%.0f/s", r.Shape, r.OfferedRate)
	case ShapeFanout:
		if r.Fanout != nil {
			return fmt.Sprintf("fanout(%d)", r.Fanout.Children)
		}
	}
	return r.Shape
}

func progressLine(r Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-10s %-18s %9s produced/s", r.Target, shapeLabel(r), count(r.ProducedRate))
	if r.Check != nil {
		fmt.Fprintf(&b, " %9s acked/s, lost %d, dup %d", count(r.AckedRate), r.Check.Lost, r.Check.Duplicates)
	}
	fmt.Fprintf(&b, ", errors %d", r.Errors)
	if r.FirstError != "" {
		fmt.Fprintf(&b, " (first: %s)", r.FirstError)
	}
	return b.String()
}

// table is a fixed-width text table: the first left columns are aligned left, the
// others (numbers) right.
type table struct {
	left int
	rows [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer) {
	var width []int
	for _, r := range t.rows {
		for i, c := range r {
			if i >= len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range t.rows {
		var b strings.Builder
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i > 0 {
				b.WriteString("  ")
			}
			if i < t.left {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// PrintTable writes the results of one target as two fixed-width tables: one row per
// shape with throughput, the account of messages and the server's resources; then
// one row per shape and operation with latency percentiles.
func PrintTable(w io.Writer, rs []Result) {
	if len(rs) == 0 {
		return
	}
	fmt.Fprintf(w, "%s\n", rs[0].Target)
	t := &table{left: 1}
	t.add("shape", "produced/s", "acked/s", "payload MB/s", "lost", "dup", "unconf", "errors", "drain", "cpu cores", "rss peak MB", "bench cpu")
	for _, r := range rs {
		lost, dup, unconf, drain := "-", "-", "-", "-"
		acked := "-"
		if r.Check != nil {
			acked = count(r.AckedRate)
			lost, dup, unconf = fmt.Sprint(r.Check.Lost), fmt.Sprint(r.Check.Duplicates), fmt.Sprint(r.Check.Unconfirmed)
			drain = r.Drain.Round(time.Millisecond).String()
			if r.DrainTimedOut {
				drain += "!"
			}
		}
		cpu, rss, self := "-", "-", "-"
		if r.Usage != nil {
			cpu = fmt.Sprintf("%.2f", r.Usage.CPU)
			rss = fmt.Sprintf("%.1f", float64(r.Usage.RSSPeak)/1e6)
		}
		if r.Client != nil {
			self = fmt.Sprintf("%.2f", r.Client.CPU)
		}
		t.add(shapeLabel(r), count(r.ProducedRate), acked, fmt.Sprintf("%.2f", r.PayloadMBps), lost, dup, unconf, fmt.Sprint(r.Errors), drain, cpu, rss, self)
	}
	t.write(w)
	fmt.Fprintf(w, "\n%s latency, ms\n", rs[0].Target)
	t = &table{left: 2}
	t.add("shape", "operation", "n", "p50", "p90", "p99", "max")
	for _, r := range rs {
		for _, l := range r.Latencies {
			if l.N == 0 {
				t.add(shapeLabel(r), l.Op, "0", "-", "-", "-", "-")
				continue
			}
			t.add(shapeLabel(r), l.Op, fmt.Sprint(l.N), ms(l.P50), ms(l.P90), ms(l.P99), ms(l.Max))
		}
	}
	t.write(w)
	for _, r := range rs {
		if f := r.Fanout; f != nil {
			caught := f.CaughtUp.Round(time.Millisecond).String()
			if f.CaughtUpTimedOut {
				caught = "not within the drain bound (" + caught + ")"
			}
			fmt.Fprintf(w, "\nfan-out: %s msg/s into the parent, %d children: %s copies/s, max total lag %d messages, caught up %s after the last produce\n",
				count(r.ProducedRate), f.Children, count(f.CopiesRate), f.MaxLag, caught)
		}
	}
	for _, r := range rs {
		if r.FirstError != "" {
			fmt.Fprintf(w, "%s: first error: %s\n", shapeLabel(r), r.FirstError)
		}
	}
}

// Legend is what PrintLegend writes: the definition of every column and operation.
const Legend = `columns: produced/s = produce confirmations per second over the window; acked/s =
  settled messages per second over the same window (latency: includes the backlog made
  before the window); payload MB/s = confirmed payload bytes / 10^6 / s; lost = confirmed
  but never delivered by the end of the drain; dup = ids delivered more than once;
  unconf = delivered although their produce was not confirmed; errors = failed requests
  plus failed entries of batches; drain = time after the window until every confirmed
  message was delivered ("!" = the drain bound passed first); cpu cores = the server's
  user+system CPU seconds per second over the window (/proc/<pid>/stat); rss peak MB =
  the largest VmRSS sampled every 100 ms; bench cpu = the same CPU figure for this
  load generator, which shares the machine.
operations: produce and produce-batch = request to confirmation (latency shape: from
  the scheduled send time, so a broker that falls behind is charged for it); consume
  and consume-batch = request to answer of consumes that returned messages, long-poll
  wait included; consume-avail = the same for a message whose produce was confirmed
  before the consume was sent (it was waiting); ack and ack-batch = request to
  confirmation; wake-up = for a consume sent before its message's produce was
  confirmed (the consumer was parked in its long poll), the time its answer arrived
  minus the time the produce's confirmation arrived, clamped at 0 (a broker may answer
  the parked consumer before the producer).`

// PrintLegend writes Legend.
func PrintLegend(w io.Writer) { fmt.Fprintln(w, Legend) }
