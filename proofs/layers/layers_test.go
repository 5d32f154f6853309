// Package layers proves the house's rules (docs/design.md, "The house")
// from the module's real imports: product packages import only lower
// layers, production code never imports a harness, a proof or a tool, tools
// never import proofs, and every product package has its place in the
// table.
package layers

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
)

const module = "github.com/ferryhq/ferry"

// pkg is what go list says of one package.
type pkg struct {
	ImportPath string
	Imports    []string
}

// own strips the module path; "" for a package of another module.
func own(path string) (string, bool) {
	if path == module {
		return "", true
	}
	rest, ok := strings.CutPrefix(path, module+"/")
	return rest, ok
}

// kind sorts a package by folder: product, program, tool, proof, harness.
func kind(p string) string {
	switch {
	case strings.HasPrefix(p, "proofs/harness/"):
		return "harness"
	case strings.HasPrefix(p, "proofs/"):
		return "proof"
	case strings.HasPrefix(p, "tools/"):
		return "tool"
	case strings.HasPrefix(p, "cmd/"):
		return "program"
	case strings.HasSuffix(filepath.Base(p), "test"):
		return "harness" // consumer/consumertest, auth/authtest
	}
	return "product"
}

// layers reads the table of docs/design.md: package → layer.
func layers(t *testing.T, root string) map[string]int {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int{}
	in := false
	names := regexp.MustCompile("`([a-z0-9/]+)`")
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "<!-- layers:begin -->":
			in = true
		case line == "<!-- layers:end -->":
			in = false
		case in && strings.HasPrefix(line, "| "):
			cells := strings.Split(line, "|")
			n, err := strconv.Atoi(strings.TrimSpace(cells[1]))
			if err != nil {
				continue // the header row
			}
			for _, m := range names.FindAllStringSubmatch(cells[2], -1) {
				if prev, dup := out[m[1]]; dup {
					t.Fatalf("docs/design.md places %s in layers %d and %d", m[1], prev, n)
				}
				out[m[1]] = n
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no layer table between <!-- layers:begin --> and <!-- layers:end --> in docs/design.md")
	}
	return out
}

// packages lists the module's packages with their non-test imports.
func packages(t *testing.T, root string) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var ps []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps
}

// TestLayers: every rule of the house, from the real imports.
func TestLayers(t *testing.T) {
	root, err := agenttest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	layer := layers(t, root)
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	seen := map[string]bool{}
	for _, p := range packages(t, root) {
		from, _ := own(p.ImportPath)
		seen[from] = true
		fk := kind(from)
		fl, placed := layer[from]
		if (fk == "product" || from == "cmd/ferry" || strings.HasPrefix(from, "cmd/ferry/")) && !placed {
			fail("%s is not in the layer table of docs/design.md: give it its layer", from)
		}
		for _, imp := range p.Imports {
			to, ok := own(imp)
			if !ok {
				continue
			}
			tk := kind(to)
			switch fk {
			case "product":
				if tk != "product" {
					fail("%s (product) imports %s (%s): production code uses only the product", from, to, tk)
					continue
				}
			case "program":
				if tk == "proof" || tk == "harness" {
					fail("%s (program) imports %s (%s)", from, to, tk)
				}
				if tk == "tool" && !strings.HasPrefix(from, "cmd/ferry-bench") {
					fail("%s (program) imports the tool %s: only ferry-bench is built from tools", from, to)
				}
			case "tool":
				if tk == "proof" || tk == "harness" || tk == "program" {
					fail("%s (tool) imports %s (%s): tools never import proofs", from, to, tk)
				}
			case "proof", "harness":
				if tk == "program" {
					fail("%s (%s) imports the program %s", from, fk, to)
				}
			}
			tl, tplaced := layer[to]
			if placed && tplaced && tl >= fl && !strings.HasPrefix(to, from+"/") {
				fail("%s (layer %d) imports %s (layer %d): layers only point down", from, fl, to, tl)
			}
		}
	}
	for p := range layer {
		if !seen[p] {
			fail("docs/design.md places %s, which is no package of the module", p)
		}
	}
	for _, b := range bad {
		t.Error(b)
	}
}
