// Package layers holds one test: the import order of aether's packages (README.md, Layout).
package layers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/aethermesh/aether/internal/testenv"
)

const module = "github.com/aethermesh/aether/"

// tiers lists aether's top-level directories from the top down: a package may import packages
// of its own tier or of a lower one (a higher index), never a higher one.
var tiers = [][]string{
	{"cmd"},
	{"agent", "registrar"},
	{"xds", "dnsd", "tunnel", "cni", "envoy"},
	{"registry", "capture", "bpf", "identity", "model", "api", "deploy", "images"},
}

// tierOf returns the tier of an aether package path relative to the module ("xds",
// "registrar/mcs", "internal/testenv"): -1 for internal/*, -2 for e2e/, bench/ and hack/ (free:
// tests, benchmarks and developer commands), and an error for a top-level directory no tier
// names.
func tierOf(rel string) (int, error) {
	top, _, _ := strings.Cut(rel, "/")
	switch top {
	case "internal":
		return -1, nil
	case "e2e", "bench", "hack":
		return -2, nil
	}
	for i, t := range tiers {
		for _, d := range t {
			if d == top {
				return i, nil
			}
		}
	}
	return 0, fmt.Errorf("top-level directory %q is in no tier: add it to tiers and to README.md's Layout", top)
}

type pkg struct {
	ImportPath                         string
	Imports, TestImports, XTestImports []string
}

// layerViolations checks the import edges of pkgs, their tests' included, and returns one line
// per broken rule:
//   - an import of a package in a higher tier;
//   - an internal/* package importing a non-internal package above the lowest tier (it must
//     sit below whatever uses it);
//   - an import of e2e/, bench/ or hack/ from outside them.
func layerViolations(pkgs []pkg) []string {
	var out []string
	for _, p := range pkgs {
		from, ok := strings.CutPrefix(p.ImportPath, module)
		if !ok {
			continue
		}
		ft, err := tierOf(from)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		check := func(imp string) {
			to, ok := strings.CutPrefix(imp, module)
			if !ok || to == from {
				return
			}
			tt, err := tierOf(to)
			if err != nil {
				out = append(out, err.Error())
				return
			}
			switch {
			case tt == -2 && ft != -2:
				out = append(out, fmt.Sprintf("%s imports %s: nothing imports e2e/, bench/ or hack/", from, to))
			case ft == -2 || tt == -1:
			case ft == -1 && tt != len(tiers)-1:
				out = append(out, fmt.Sprintf("%s imports %s: internal/* sits below what uses it, so it imports only internal/* and the lowest tier", from, to))
			case ft >= 0 && tt < ft:
				out = append(out, fmt.Sprintf("%s (tier %d) imports %s (tier %d): a package imports only its own tier or lower ones", from, ft, to, tt))
			}
		}
		for _, imp := range append(append(append([]string{}, p.Imports...), p.TestImports...), p.XTestImports...) {
			check(imp)
		}
	}
	return out
}

// TestImportLayers: every package of the module, with its tests, keeps the import order of
// README.md's Layout (go list resolves build tags for this machine, linux).
func TestImportLayers(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages; want the whole module", len(pkgs))
	}
	for _, v := range layerViolations(pkgs) {
		t.Error(v)
	}
}

// TestLayerViolations: the checker itself refuses each kind of broken edge and accepts the
// allowed ones.
func TestLayerViolations(t *testing.T) {
	m := func(s string) string { return module + s }
	for _, c := range []struct {
		name string
		p    pkg
		bad  bool
	}{
		{"downward", pkg{ImportPath: m("xds"), Imports: []string{m("model"), m("tunnel"), "fmt"}}, false},
		{"upward", pkg{ImportPath: m("model"), Imports: []string{m("xds")}}, true},
		{"registry above agent", pkg{ImportPath: m("registry"), Imports: []string{m("agent")}}, true},
		{"cmd to agent", pkg{ImportPath: m("cmd/aether-agent"), Imports: []string{m("agent")}}, false},
		{"test import sideways", pkg{ImportPath: m("xds"), TestImports: []string{m("envoy"), m("internal/testenv")}}, false},
		{"test import upward", pkg{ImportPath: m("cni"), XTestImports: []string{m("agent")}}, true},
		{"internal below its users", pkg{ImportPath: m("internal/registryflag"), Imports: []string{m("registry"), m("internal/envflag")}}, false},
		{"internal above", pkg{ImportPath: m("internal/registryflag"), Imports: []string{m("xds")}}, true},
		{"test imports e2e", pkg{ImportPath: m("agent"), XTestImports: []string{m("e2e/mesh")}}, true},
		{"e2e imports anything", pkg{ImportPath: m("e2e/mesh"), Imports: []string{m("agent"), m("e2e/substrate")}}, false},
		{"hack imports anything", pkg{ImportPath: m("hack/images"), Imports: []string{m("images"), m("internal/testenv")}}, false},
		{"nothing imports hack", pkg{ImportPath: m("images"), Imports: []string{m("hack/images")}}, true},
		{"unknown top-level", pkg{ImportPath: m("gateway"), Imports: []string{m("model")}}, true},
	} {
		if got := layerViolations([]pkg{c.p}); (len(got) > 0) != c.bad {
			t.Errorf("%s: violations %q, want bad=%v", c.name, got, c.bad)
		}
	}
}
