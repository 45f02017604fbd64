package runner

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// KnownFailure is an entry of known-failures.yaml: a scenario an SDK is known to fail,
// the rule it breaks and why. The suite stays green on it and reports it as such.
type KnownFailure struct {
	Scenario string `yaml:"scenario"`
	Driver   string `yaml:"driver"`
	Rule     string `yaml:"rule"`
	Reason   string `yaml:"reason"`
}

// LoadKnownFailures reads known-failures.yaml; a missing file is an empty list.
func LoadKnownFailures(path string) ([]KnownFailure, error) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []KnownFailure
	if err := yaml.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// ApplyKnown turns failures listed in known into known failures, and passes listed
// there into unexpected passes (the entry should go).
func ApplyKnown(results []Result, known []KnownFailure) {
	for i := range results {
		r := &results[i]
		for _, k := range known {
			if k.Scenario != r.Scenario || k.Driver != r.Driver {
				continue
			}
			r.Known = k.Rule + ": " + k.Reason
			switch r.Outcome {
			case Fail:
				r.Outcome = XFail
			case Pass:
				r.Outcome = XPass
			}
		}
	}
}

// Rule is one numbered rule of SPEC.md.
type Rule struct {
	ID    string
	Title string
}

var ruleLine = regexp.MustCompile(`^- \*\*(CB-[A-Z]+-\d+)\*\*\s*(.*)$`)

// LoadRules reads the rules of SPEC.md: lines "- **CB-XXX-N** text".
func LoadRules(path string) ([]Rule, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Rule
	for _, line := range strings.Split(string(data), "\n") {
		if m := ruleLine.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			title := m[2]
			if i := strings.Index(title, ". "); i > 0 {
				title = title[:i+1]
			}
			out = append(out, Rule{ID: m[1], Title: title})
		}
	}
	return out, nil
}

// Failed reports whether any result fails the run.
func Failed(results []Result) bool {
	for _, r := range results {
		if r.Outcome == Fail {
			return true
		}
	}
	return false
}

func driversOf(results []Result) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range results {
		if !seen[r.Driver] {
			seen[r.Driver] = true
			out = append(out, r.Driver)
		}
	}
	return out
}

func cell(outcome string) string {
	switch outcome {
	case Pass:
		return "pass"
	case Fail:
		return "FAIL"
	case NA:
		return "n/a"
	case XFail:
		return "known"
	case XPass:
		return "XPASS"
	}
	return outcome
}

// WriteSummary prints the human report: a scenario × driver table, then every failure,
// known failure and n/a with its reason, then rule coverage.
func WriteSummary(w io.Writer, results []Result, rules []Rule, verbose bool) {
	drivers := driversOf(results)
	by := map[string]map[string]Result{}
	var names []string
	for _, r := range results {
		if by[r.Scenario] == nil {
			by[r.Scenario] = map[string]Result{}
			names = append(names, r.Scenario)
		}
		by[r.Scenario][r.Driver] = r
	}
	fmt.Fprintf(w, "\n%-44s %-9s", "scenario", "tier")
	for _, d := range drivers {
		fmt.Fprintf(w, " %-13s", d)
	}
	fmt.Fprintln(w)
	for _, n := range names {
		var tier string
		for _, r := range by[n] {
			tier = r.Tier
		}
		fmt.Fprintf(w, "%-44s %-9s", n, tier)
		for _, d := range drivers {
			r, ok := by[n][d]
			c := "-"
			if ok {
				c = fmt.Sprintf("%s %.1fs", cell(r.Outcome), float64(r.DurationMs)/1000)
			}
			fmt.Fprintf(w, " %-13s", c)
		}
		fmt.Fprintln(w)
	}
	for _, r := range results {
		switch r.Outcome {
		case Pass:
			if !verbose {
				continue
			}
		case NA:
			fmt.Fprintf(w, "\nn/a   %s [%s]: %s\n", r.Scenario, r.Driver, r.Reason)
			continue
		case XFail:
			fmt.Fprintf(w, "\nknown failure  %s [%s]: %s\n       this run: %s\n", r.Scenario, r.Driver, r.Known, r.Reason)
			continue
		case XPass:
			fmt.Fprintf(w, "\nUNEXPECTED PASS  %s [%s]: listed in known-failures.yaml (%s) but passed; remove the entry\n", r.Scenario, r.Driver, r.Known)
			continue
		}
		fmt.Fprintf(w, "\n%s  %s [%s] %s\n", strings.ToUpper(r.Outcome), r.Scenario, r.Driver, r.Reason)
		if r.Outcome == Fail || verbose {
			for _, l := range r.Log {
				fmt.Fprintf(w, "    %s\n", strings.ReplaceAll(l, "\n", "\n    "))
			}
		}
	}
	fmt.Fprintf(w, "\nrule coverage (scenarios; per driver pass/known/fail/n-a):\n")
	for _, ru := range rules {
		var scen []string
		counts := map[string][4]int{}
		for _, n := range names {
			for _, d := range drivers {
				r, ok := by[n][d]
				if !ok || !contains(r.Rules, ru.ID) {
					continue
				}
				if !contains(scen, n) {
					scen = append(scen, n)
				}
				c := counts[d]
				switch r.Outcome {
				case Pass, XPass:
					c[0]++
				case XFail:
					c[1]++
				case Fail:
					c[2]++
				case NA:
					c[3]++
				}
				counts[d] = c
			}
		}
		fmt.Fprintf(w, "  %-12s %2d", ru.ID, len(scen))
		for _, d := range drivers {
			c := counts[d]
			fmt.Fprintf(w, "  %s %d/%d/%d/%d", d, c[0], c[1], c[2], c[3])
		}
		if len(scen) == 0 {
			fmt.Fprintf(w, "  (not covered)")
		}
		fmt.Fprintln(w)
	}
	var pass, fail, na, xf, xp int
	for _, r := range results {
		switch r.Outcome {
		case Pass:
			pass++
		case Fail:
			fail++
		case NA:
			na++
		case XFail:
			xf++
		case XPass:
			xp++
		}
	}
	fmt.Fprintf(w, "\nconformance: %d passed, %d failed, %d skipped (n/a), %d known failures, %d unexpected passes\n", pass, fail, na, xf, xp)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// WriteJSON writes every result as JSON.
func WriteJSON(path string, results []Result) error {
	data, err := json.MarshalIndent(map[string]any{"results": results}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      float64       `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes one JUnit suite per driver; n/a and known failures are skipped.
func WriteJUnit(path string, results []Result) error {
	var out junitSuites
	for _, d := range driversOf(results) {
		s := junitSuite{Name: "conformance." + d}
		for _, r := range results {
			if r.Driver != d {
				continue
			}
			c := junitCase{Name: r.Scenario, Classname: "conformance." + d + "." + r.Tier, Time: float64(r.DurationMs) / 1000}
			switch r.Outcome {
			case Fail:
				c.Failure = &junitMessage{Message: r.Reason, Text: strings.Join(r.Log, "\n")}
				s.Failures++
			case NA:
				c.Skipped = &junitMessage{Message: "n/a: " + r.Reason}
				s.Skipped++
			case XFail:
				c.Skipped = &junitMessage{Message: "known failure: " + r.Known}
				s.Skipped++
			case XPass:
				c.SystemOut = "unexpected pass: remove the known-failures.yaml entry"
			}
			s.Tests++
			s.Cases = append(s.Cases, c)
		}
		out.Suites = append(out.Suites, s)
	}
	data, err := xml.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte(xml.Header), data...), 0o644)
}

// WriteMatrix writes the SDK × scenario matrix as Markdown, for the docs.
func WriteMatrix(path string, results []Result, rules []Rule) error {
	return os.WriteFile(path, []byte(RenderMatrix(results, rules)), 0o644)
}

// RenderMatrix is the SDK × scenario matrix of a run, as Markdown.
func RenderMatrix(results []Result, rules []Rule) string {
	drivers := driversOf(results)
	sdk := map[string]string{}
	for _, r := range results {
		if r.SDK != "" {
			sdk[r.Driver] = r.SDK
		}
	}
	var b strings.Builder
	b.WriteString("# SDK conformance matrix\n\n")
	b.WriteString("Generated by `make -C conformance test` (or `matrix`) from a run of the suite; do not edit by hand.\n")
	b.WriteString("Rules are in [SPEC.md](SPEC.md); `known` marks an entry of [known-failures.yaml](known-failures.yaml).\n\n")
	b.WriteString("| scenario | tier | rules |")
	for _, d := range drivers {
		fmt.Fprintf(&b, " %s |", d)
	}
	b.WriteString("\n|---|---|---|")
	for range drivers {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	by := map[string]map[string]Result{}
	var names []string
	for _, r := range results {
		if by[r.Scenario] == nil {
			by[r.Scenario] = map[string]Result{}
			names = append(names, r.Scenario)
		}
		by[r.Scenario][r.Driver] = r
	}
	sort.Strings(names)
	for _, n := range names {
		var any Result
		for _, r := range by[n] {
			any = r
		}
		fmt.Fprintf(&b, "| [%s](scenarios/%s/README.md) | %s | %s |", n, n, any.Tier, strings.Join(any.Rules, ", "))
		for _, d := range drivers {
			fmt.Fprintf(&b, " %s |", cell(by[n][d].Outcome))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n| driver | SDK |\n|---|---|\n")
	for _, d := range drivers {
		fmt.Fprintf(&b, "| %s | %s |\n", d, sdk[d])
	}
	b.WriteString("\n## Rules and the scenarios that cover them\n\n")
	for _, ru := range rules {
		var scen []string
		for _, n := range names {
			for _, r := range by[n] {
				if contains(r.Rules, ru.ID) {
					scen = append(scen, n)
				}
				break
			}
		}
		cov := strings.Join(scen, ", ")
		if cov == "" {
			cov = "(not covered yet)"
		}
		fmt.Fprintf(&b, "- **%s** %s — %s\n", ru.ID, ru.Title, cov)
	}
	return b.String()
}
