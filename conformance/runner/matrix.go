package runner

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// ErrStaleMatrix means the committed MATRIX.md no longer matches the scenarios and rules.
var ErrStaleMatrix = errors.New("MATRIX.md is stale: run `make -C conformance test` (it regenerates MATRIX.md) and commit it")

var (
	matrixRow = regexp.MustCompile(`^\| \[([^\]]+)\]\(scenarios/[^)]*\) \|`)
	sdkRow    = regexp.MustCompile(`^\| ([^|]+) \| ([^|]*) \|$`)
)

// CheckMatrix checks, without running anything, that the matrix at path is what a run
// would write for scenarios and rules, taking the outcomes and SDK versions recorded in
// it as they are: every scenario has its row with its tier and rules, no row is left of a
// removed scenario, and the rule coverage is current. It fails with ErrStaleMatrix.
func CheckMatrix(path string, scenarios []*Scenario, rules []Rule) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	committed := string(data)
	lines := strings.Split(committed, "\n")
	var drivers []string
	outcomes := map[string]map[string]string{} // scenario → driver → outcome
	sdk := map[string]string{}
	inSDK := false
	for _, line := range lines {
		switch {
		case strings.HasPrefix(line, "| scenario | tier | rules |"):
			for _, d := range strings.Split(strings.TrimSuffix(strings.TrimPrefix(line, "| scenario | tier | rules |"), "|"), "|") {
				drivers = append(drivers, strings.TrimSpace(d))
			}
		case strings.HasPrefix(line, "| driver | SDK |"):
			inSDK = true
		case inSDK && sdkRow.MatchString(line) && !strings.HasPrefix(line, "|---"):
			m := sdkRow.FindStringSubmatch(line)
			sdk[strings.TrimSpace(m[1])] = strings.TrimSpace(m[2])
		case matrixRow.MatchString(line):
			name := matrixRow.FindStringSubmatch(line)[1]
			cells := strings.Split(strings.Trim(line, "|"), "|")
			got := map[string]string{}
			for i, d := range drivers {
				if j := 3 + i; j < len(cells) {
					got[d] = uncell(strings.TrimSpace(cells[j]))
				}
			}
			outcomes[name] = got
		}
	}
	if len(drivers) == 0 {
		return fmt.Errorf("%s: no matrix header: %w", path, ErrStaleMatrix)
	}
	sorted := append([]*Scenario(nil), scenarios...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	var results []Result
	for _, sc := range sorted {
		for _, d := range drivers {
			out, ok := outcomes[sc.Name][d]
			if !ok {
				out = "not run" // a scenario the matrix does not have yet
			}
			results = append(results, Result{Scenario: sc.Name, Tier: sc.Tier, Rules: sc.Rules, Driver: d, SDK: sdk[d], Outcome: out})
		}
	}
	want := RenderMatrix(results, rules)
	if want == committed {
		return nil
	}
	wl, cl := strings.Split(want, "\n"), lines
	for i := 0; i < max(len(wl), len(cl)); i++ {
		var w, c string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(cl) {
			c = cl[i]
		}
		if w != c {
			return fmt.Errorf("%s line %d is\n  %s\nand should be\n  %s\n%w", path, i+1, c, w, ErrStaleMatrix)
		}
	}
	return ErrStaleMatrix
}

// uncell is the outcome a matrix cell shows (the inverse of cell).
func uncell(c string) string {
	for _, o := range []string{Pass, Fail, NA, XFail, XPass} {
		if cell(o) == c {
			return o
		}
	}
	return c
}
