package runner

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCommittedMatrixIsCurrent: MATRIX.md must list every scenario with its tier and
// rules and the current rule coverage; a scenario or rule added without regenerating
// it fails here (and so in `make -C conformance unit`, which `test` runs first).
func TestCommittedMatrixIsCurrent(t *testing.T) {
	scenarios, err := LoadScenarios("../scenarios")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := LoadRules("../SPEC.md")
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckMatrix("../MATRIX.md", scenarios, rules); err != nil {
		t.Fatal(err)
	}
}

// TestCheckMatrixNoticesChanges: the check fails for a missing row, a removed scenario's
// row and changed rules, and passes for the matrix a run wrote.
func TestCheckMatrixNoticesChanges(t *testing.T) {
	rules := []Rule{{ID: "CB-X-1", Title: "One."}, {ID: "CB-X-2", Title: "Two."}}
	a := &Scenario{Name: "wire-a", Tier: "wire", Rules: []string{"CB-X-1"}}
	b := &Scenario{Name: "wire-b", Tier: "wire", Rules: []string{"CB-X-2"}}
	results := func(scs ...*Scenario) []Result {
		var out []Result
		for _, sc := range scs {
			for _, d := range []string{"go", "js"} {
				out = append(out, Result{Scenario: sc.Name, Tier: sc.Tier, Rules: sc.Rules, Driver: d, SDK: d + "-sdk 1", Outcome: Pass})
			}
		}
		return out
	}
	path := filepath.Join(t.TempDir(), "MATRIX.md")
	if err := WriteMatrix(path, results(a, b), rules); err != nil {
		t.Fatal(err)
	}
	if err := CheckMatrix(path, []*Scenario{a, b}, rules); err != nil {
		t.Fatalf("the matrix a run wrote: %v", err)
	}
	c := &Scenario{Name: "wire-c", Tier: "wire", Rules: []string{"CB-X-1"}}
	b2 := &Scenario{Name: "wire-b", Tier: "wire", Rules: []string{"CB-X-1", "CB-X-2"}}
	for name, tc := range map[string]struct {
		scs   []*Scenario
		rules []Rule
	}{
		"a new scenario":     {[]*Scenario{a, b, c}, rules},
		"a removed scenario": {[]*Scenario{a}, rules},
		"changed rules":      {[]*Scenario{a, b2}, rules},
		"a new rule":         {[]*Scenario{a, b}, append(rules, Rule{ID: "CB-X-3", Title: "Three."})},
	} {
		err := CheckMatrix(path, tc.scs, tc.rules)
		if !errors.Is(err, ErrStaleMatrix) {
			t.Errorf("%s: %v, want ErrStaleMatrix", name, err)
		}
	}
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), "| go | go-sdk 1 |") {
		t.Fatalf("matrix without its SDK table:\n%s", data)
	}
}
