package runner

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// Scenario is one behaviour, read from scenarios/<name>/scenario.yaml. Its README.md
// beside it says in prose what it checks and why.
type Scenario struct {
	// Name is the scenario's directory name; it is the scenario's id in every report.
	Name string `yaml:"-"`
	// Dir is where the scenario was read from.
	Dir string `yaml:"-"`
	// Title is one line for people.
	Title string `yaml:"title"`
	// Rules names the SPEC.md rules the scenario covers.
	Rules []string `yaml:"rules"`
	// Tier is "wire" (against the runner's scripted mock), "behaviour" (against the
	// real narad binary behind the runner's fault proxy) or "cluster" (against a
	// cluster of three or more nodes whose nodes the scenario may kill: one endpoint per
	// node, run one at a time, never against a single node).
	Tier string `yaml:"tier"`
	// Requires lists the driver capabilities the scenario needs; a driver lacking one
	// reports the scenario as n/a.
	Requires []string `yaml:"requires"`
	// Endpoints is how many endpoints the driver's client gets (default 1): mock nodes
	// in the wire tier, fault proxies in front of the one broker in the behaviour tier.
	// DeadEndpoints adds that many endpoints nobody listens on, first in the list.
	// In the cluster tier there is one endpoint per node, always.
	Endpoints     int `yaml:"endpoints"`
	DeadEndpoints int `yaml:"dead_endpoints"`
	// FirstEndpoint (cluster tier) puts first in the client's endpoint list the node
	// that leads a partition (leader_of) or one that does not (follower_of), so a
	// scenario says whether the node its client sticks to is the one it kills.
	// Without it the endpoints are in node order.
	FirstEndpoint *NodePick `yaml:"first_endpoint"`
	// Topics are created before the steps run (behaviour tier: on the broker; wire
	// tier: in the mock). Each gets a unique name, bound to ${short name}.
	Topics []TopicSpec `yaml:"topics"`
	// Mock configures the wire tier's fake broker.
	Mock MockSpec `yaml:"mock"`
	// Faults are installed before the steps run (both tiers).
	Faults []Fault `yaml:"faults"`
	// Steps run in order.
	Steps []Step `yaml:"steps"`
	// Invariants are checked over the whole recorded history once the steps are done.
	Invariants []Invariant `yaml:"invariants"`
	// TimeoutMs bounds the whole scenario (default 60000).
	TimeoutMs int `yaml:"timeout_ms"`
}

// TopicSpec is a topic a scenario needs.
type TopicSpec struct {
	Name              string         `yaml:"name"`
	Partitions        int            `yaml:"partitions"`
	VisibilityTimeout int64          `yaml:"visibility_timeout_ms"`
	Retention         int64          `yaml:"retention_ms"`
	Schema            map[string]any `yaml:"schema"`
	// Queue pre-loads the wire tier's fake broker with messages (text bodies).
	Queue []string `yaml:"queue"`
	// Redeliver (wire tier) makes the fake broker lease what it hands out: a message
	// not acked comes back, with delivery_attempt + 1, when its lease lapses (after the
	// visibility timeout, or the delay of a nack or extend). Without it the fake
	// delivers each message once.
	Redeliver bool `yaml:"redeliver"`
}

// NodePick names a node of a cluster by its role for a partition.
type NodePick struct {
	LeaderOf   *PartitionRef `yaml:"leader_of" json:"leader_of,omitempty"`
	FollowerOf *PartitionRef `yaml:"follower_of" json:"follower_of,omitempty"`
}

// PartitionRef is one partition of a topic (a scenario topic's short name or ${name}).
type PartitionRef struct {
	Topic     string `yaml:"topic" json:"topic"`
	Partition int    `yaml:"partition" json:"partition"`
}

// MockSpec configures the wire tier's fake broker.
type MockSpec struct {
	// MaxWaitMs caps how long the fake answers a long poll with nothing (default 200).
	MaxWaitMs int `yaml:"max_wait_ms"`
}

// Step is one action: a driver command (client.new, produce, ...) or a runner action
// (fault, wait_event, admin.*, ...), with what is expected of it.
type Step struct {
	Action string
	Args   any
	// Save binds the result (or, for wait_event, the matched events) to a variable.
	Save string
	// Expect is subset-matched against the result; ExpectError against the normalised
	// error (a step without ExpectError must succeed).
	Expect      any
	ExpectError any
	// ElapsedMs bounds how long the step took, as the runner saw it.
	ElapsedMs *Range
	// Since bounds the time from a mark to the end of the step.
	Since *SinceSpec
	// Requests checks the HTTP exchanges recorded while the step ran.
	Requests *RequestsSpec
	// Async runs a driver command without waiting; `await: name` collects it later.
	Async string
	// AllowError lets a driver command fail without failing the step (Save then binds
	// {"error": ...}); an assert step can look at it later.
	AllowError bool
	// TimeoutMs bounds the step (default 30000).
	TimeoutMs int
	// Line is the step's line in the YAML file, for messages.
	Line int
}

// Range is an inclusive bound in milliseconds; a zero Max means none.
type Range struct {
	Min float64 `yaml:"min"`
	Max float64 `yaml:"max"`
}

// SinceSpec bounds the time from a mark to the end of a step.
type SinceSpec struct {
	Mark  string `yaml:"mark"`
	Range `yaml:",inline"`
}

// RequestsSpec checks exchanges recorded while a step ran, in order.
type RequestsSpec struct {
	// Where selects which exchanges count (subset match); empty selects all.
	Where any `yaml:"where"`
	// Count, when set, is the exact number of selected exchanges.
	Count *int `yaml:"count"`
	// Min is the least number of selected exchanges.
	Min int `yaml:"min"`
	// Items are subset-matched one by one against the first selected exchanges.
	Items []any `yaml:"items"`
	// All is subset-matched against every selected exchange.
	All any `yaml:"all"`
	// GapsMs bounds the time between the starts of consecutive selected exchanges.
	GapsMs *Range `yaml:"gaps_ms"`
}

// Fault is a rule of the mock or the fault proxy: requests it matches get its action
// instead of (or on top of) the normal answer, Times times (0: every time).
type Fault struct {
	Match FaultMatch `yaml:"match" json:"match,omitempty"`
	Times int        `yaml:"times" json:"times,omitempty"`
	// Skip lets that many matching requests through untouched first.
	Skip int `yaml:"skip" json:"skip,omitempty"`
	// Status answers at once with this status (nothing reaches the broker).
	Status  int               `yaml:"status" json:"status,omitempty"`
	Headers map[string]string `yaml:"headers" json:"headers,omitempty"`
	JSON    any               `yaml:"json" json:"json,omitempty"`
	Body    string            `yaml:"body" json:"body,omitempty"`
	// DropReply lets the request be served, then closes the connection without the reply.
	DropReply bool `yaml:"drop_reply" json:"drop_reply,omitempty"`
	// Reset closes the connection without serving the request.
	Reset bool `yaml:"reset" json:"reset,omitempty"`
	// DelayMs holds the request this long before acting.
	DelayMs int `yaml:"delay_ms" json:"delay_ms,omitempty"`
}

// FaultMatch selects requests: method, path (exact, or a regexp after "~"), node index
// and query parameters (a value, "~regexp", "$absent" or "$present").
type FaultMatch struct {
	Method string            `yaml:"method" json:"method,omitempty"`
	Path   string            `yaml:"path" json:"path,omitempty"`
	Node   *int              `yaml:"node" json:"node,omitempty"`
	Query  map[string]string `yaml:"query" json:"query,omitempty"`
}

// Invariant is a check over the whole recorded history.
type Invariant struct {
	Kind string
	Args any
}

// UnmarshalYAML reads a step: one action key plus modifiers.
func (s *Step) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: a step is a mapping", n.Line)
	}
	s.Line = n.Line
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i].Value, n.Content[i+1]
		var err error
		switch k {
		case "save":
			err = v.Decode(&s.Save)
		case "expect":
			err = v.Decode(&s.Expect)
		case "expect_error":
			err = v.Decode(&s.ExpectError)
		case "elapsed_ms":
			s.ElapsedMs = &Range{}
			err = v.Decode(s.ElapsedMs)
		case "since":
			s.Since = &SinceSpec{}
			err = v.Decode(s.Since)
		case "requests":
			s.Requests = &RequestsSpec{}
			err = v.Decode(s.Requests)
		case "async":
			err = v.Decode(&s.Async)
		case "timeout_ms":
			err = v.Decode(&s.TimeoutMs)
		case "allow_error":
			err = v.Decode(&s.AllowError)
		case "note":
		default:
			if s.Action != "" {
				return fmt.Errorf("line %d: a step has one action, found %q and %q", n.Line, s.Action, k)
			}
			s.Action = k
			err = v.Decode(&s.Args)
		}
		if err != nil {
			return fmt.Errorf("line %d: %s: %w", v.Line, k, err)
		}
	}
	if s.Action == "" {
		return fmt.Errorf("line %d: a step needs an action", n.Line)
	}
	if s.Args == nil {
		s.Args = map[string]any{}
	}
	return nil
}

// UnmarshalYAML reads an invariant: a mapping with one key, its kind.
func (iv *Invariant) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode || len(n.Content) != 2 {
		return fmt.Errorf("line %d: an invariant is a mapping with one key", n.Line)
	}
	iv.Kind = n.Content[0].Value
	return n.Content[1].Decode(&iv.Args)
}

// LoadScenarios reads every scenarios/<name>/scenario.yaml under dir, sorted by name.
func LoadScenarios(dir string) ([]*Scenario, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []*Scenario
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name(), "scenario.yaml")
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var sc Scenario
		dec := yaml.NewDecoder(strings.NewReader(string(data)))
		dec.KnownFields(true)
		if err := dec.Decode(&sc); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		sc.Name, sc.Dir = e.Name(), filepath.Join(dir, e.Name())
		if err := sc.validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, &sc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (sc *Scenario) validate() error {
	if sc.Title == "" || len(sc.Rules) == 0 {
		return fmt.Errorf("a scenario needs a title and the rules it covers")
	}
	if sc.Tier != "wire" && sc.Tier != "behaviour" && sc.Tier != "cluster" {
		return fmt.Errorf("tier must be wire, behaviour or cluster, not %q", sc.Tier)
	}
	if sc.FirstEndpoint != nil && sc.Tier != "cluster" {
		return fmt.Errorf("first_endpoint is for the cluster tier only")
	}
	if _, err := os.Stat(filepath.Join(sc.Dir, "README.md")); err != nil {
		return fmt.Errorf("every scenario directory has a README.md: %w", err)
	}
	for _, st := range sc.Steps {
		if !knownAction(st.Action) {
			return fmt.Errorf("line %d: unknown action %q", st.Line, st.Action)
		}
		if strings.HasPrefix(st.Action, "cluster.") && sc.Tier != "cluster" {
			// A node kill on the shared single node or during other scenarios would
			// break them: it is the cluster tier's, which runs alone.
			return fmt.Errorf("line %d: %s is for the cluster tier only", st.Line, st.Action)
		}
	}
	for _, iv := range sc.Invariants {
		if _, ok := invariantChecks[iv.Kind]; !ok {
			return fmt.Errorf("unknown invariant %q", iv.Kind)
		}
	}
	return nil
}
