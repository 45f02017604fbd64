package testutil

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// mayImport is the package map of broker/README.md: for each package of the module,
// the module's packages its non-test code may import. Keep the two in step.
var mayImport = map[string][]string{
	"cmd/narad":                {"internal/broker", "internal/httpapi", "internal/cluster", "internal/meta", "internal/cli", "internal/reqid", "internal/console", "internal/storage/format"},
	"internal/console":         {},
	"internal/cluster":         {"internal/meta", "internal/transport"},
	"internal/cli":             {},
	"internal/httpapi":         {"internal/apigen", "internal/broker", "internal/auth", "internal/meta", "internal/jsondepth", "internal/jsonstr", "internal/reqid"},
	"internal/apigen":          {},
	"internal/broker":          {"internal/meta", "internal/partition", "internal/queue", "internal/auth", "internal/storage/segment", "internal/storage/vfs", "internal/storage/wal", "internal/storage/format", "internal/jsondepth", "internal/jsonstr", "internal/apigen", "internal/raftetcd", "internal/transport", "internal/failpoint"},
	"internal/meta":            {"internal/auth", "internal/storage/vfs", "internal/failpoint"},
	"internal/partition":       {"internal/queue", "internal/storage/segment", "internal/storage/vfs", "internal/failpoint"},
	"internal/queue":           {},
	"internal/auth":            {},
	"internal/storage/segment": {"internal/storage/vfs", "internal/storage/wal", "internal/failpoint"},
	"internal/storage/wal":     {"internal/storage/vfs", "internal/failpoint"},
	"internal/storage/vfs":     {},
	"internal/storage/format":  {"internal/storage/vfs", "internal/storage/wal"},
	"internal/failpoint":       {},
	"internal/jsondepth":       {},
	"internal/jsonstr":         {},
	"internal/reqid":           {},
	"internal/transport":       {},
	"internal/raftnet":         {"internal/transport"},
	"internal/raftlog":         {"internal/storage/vfs"},
	"internal/raftetcd":        {"internal/transport", "internal/raftstore", "internal/storage/vfs"},
	"internal/raftstore":       {"internal/storage/vfs", "internal/storage/wal"},
	"cmd/narad-spike":          {"internal/raftnet", "internal/raftlog", "internal/raftetcd", "internal/transport", "internal/storage/vfs"},
	"internal/testutil":        {},
	"e2e":                      {"internal/testutil", "internal/storage/format"},
}

// TestPackagesImportOnlyDownward holds the module's non-test imports to the package
// map, so a dependency that points up (storage importing the broker, httpapi reaching
// past its Broker interface into a partition) fails here, not in review.
func TestPackagesImportOnlyDownward(t *testing.T) {
	root, err := BrokerModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/narad-mq/narad/broker/"
	checked := 0
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != root && (name == "testdata" || strings.HasPrefix(name, ".")) {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		allowed, mapped := mayImport[rel]
		fset := token.NewFileSet()
		files, _ := filepath.Glob(filepath.Join(path, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range file.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if !strings.HasPrefix(p, module) {
					continue
				}
				dep := strings.TrimPrefix(p, module)
				switch {
				case !mapped:
					t.Errorf("%s imports %s; %s has no row in the package map (broker/README.md and mayImport): add one", f, dep, rel)
				case !slices.Contains(allowed, dep):
					t.Errorf("%s imports %s, which the package map does not allow %s: the dependency points the wrong way, or the map (broker/README.md and mayImport) needs a new arrow", f, dep, rel)
				}
				checked++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatal("found no import of the module's packages: the walk is broken")
	}
}
