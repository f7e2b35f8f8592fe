package architecture_test

import (
	"bufio"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/repeatrate/repeatrate/"

// Every package imports only the packages of this module that docs/architecture.md allows it:
// the table there is the contract, and a new arrow is decided there first.
func TestImportsFollowTheArchitecture(t *testing.T) {
	allowed := allowedImports(t)
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, ok := strings.CutPrefix(f[0], module)
		if !ok {
			continue // this test's own package
		}
		may, listed := allowed[pkg]
		if !listed {
			t.Errorf("package %s is not in docs/architecture.md's table", pkg)
			continue
		}
		for _, imp := range f[1:] {
			dep, ok := strings.CutPrefix(imp, module)
			if !ok || may == nil { // nil: every package (cmd)
				continue
			}
			if !slices.Contains(may, dep) {
				t.Errorf("%s imports %s, which docs/architecture.md does not allow it", pkg, dep)
			}
		}
	}
}

// allowedImports reads the table of docs/architecture.md: package → the packages it may import
// (nil for "every package above").
func allowedImports(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cells := strings.Split(sc.Text(), "|")
		if len(cells) != 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		var may []string
		switch rule := strings.TrimSpace(cells[3]); rule {
		case "every package above":
			may = nil
		default:
			may = []string{}
			for _, p := range strings.Split(rule, ",") {
				if p = strings.Trim(strings.TrimSpace(p), "`"); p != "" && p != "—" {
					may = append(may, p)
				}
			}
		}
		for _, p := range strings.Split(cells[1], ",") {
			out[strings.Trim(strings.TrimSpace(p), "`")] = may
		}
	}
	if len(out) < 10 {
		t.Fatalf("docs/architecture.md's table lists %d packages", len(out))
	}
	return out
}
