package images

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/aethermesh/aether/internal/testenv"
)

func TestParseSimulation(t *testing.T) {
	out := []byte(`NOTE: This is only a simulation!
Inst gcc-12-base (12.2.0-14+deb12u1 Debian:12.15/oldstable [amd64])
Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64]) []
Inst libattr1 (1:2.5.1-4 Debian:12.15/oldstable [amd64])
Inst netbase (6.4 Debian:12.15/oldstable [all])
Inst libssl3 [3.0.1-1] (3.0.22-1~deb12u2 Debian-Security:12/oldstable-security [amd64])
Conf libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64])
`)
	want := []debPackage{
		{"gcc-12-base", "12.2.0-14+deb12u1", "amd64"},
		{"libc6", "2.36-9+deb12u14", "amd64"},
		{"libattr1", "1:2.5.1-4", "amd64"},
		{"netbase", "6.4", "all"},
		{"libssl3", "3.0.22-1~deb12u2", "amd64"},
	}
	got := parseSimulation(out)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parseSimulation (-want +got):\n%s", diff)
	}
	if f := got[2].file(); f != "libattr1_1%3a2.5.1-4_amd64.deb" {
		t.Errorf("file of %v = %q, want apt-get download's name libattr1_1%%3a2.5.1-4_amd64.deb", got[2], f)
	}
}

func TestStatusOf(t *testing.T) {
	show := []byte("Package: debconf\nVersion: 1.5.82\nInstalled-Size: 491\nArchitecture: all\nProvides: debconf-2.0\nDepends: perl-base\nMulti-Arch: foreign\n\nPackage: dpkg\nVersion: 1.21.23\nArchitecture: amd64\n")
	want := "Package: debconf\nStatus: install ok installed\nVersion: 1.5.82\nArchitecture: all\nProvides: debconf-2.0\nMulti-Arch: foreign\n\n" +
		"Package: dpkg\nStatus: install ok installed\nVersion: 1.21.23\nArchitecture: amd64\n\n"
	if got := string(statusOf(show)); got != want {
		t.Errorf("statusOf:\n%s\nwant (no Depends: an omitted package's own dependencies are not pulled in):\n%s", got, want)
	}
}

func TestMergedUsrAndExcluded(t *testing.T) {
	for _, c := range []struct {
		in, out  string
		moved    bool
		excluded bool
	}{
		{"bin/dash", "usr/bin/dash", true, false},
		{"bin", "usr/bin", true, false},
		{"lib64/ld-linux-x86-64.so.2", "usr/lib64/ld-linux-x86-64.so.2", true, false},
		{"sbin/agetty", "usr/sbin/agetty", true, false},
		{"binaries/x", "binaries/x", false, false},
		{"usr/bin/nsenter", "usr/bin/nsenter", false, false},
		{"usr/share/man/man8/nft.8.gz", "usr/share/man/man8/nft.8.gz", false, true},
		{"usr/share/man", "usr/share/man", false, true},
		{"usr/share/locale/de/LC_MESSAGES/util-linux.mo", "usr/share/locale/de/LC_MESSAGES/util-linux.mo", false, true},
		{"usr/share/doc/iptables/copyright", "usr/share/doc/iptables/copyright", false, false},
		{"usr/share/doc/iptables", "usr/share/doc/iptables", false, false},
		{"usr/share/doc/iptables/changelog.Debian.gz", "usr/share/doc/iptables/changelog.Debian.gz", false, true},
		{"usr/share/doc/iptables/examples/x/copyright", "usr/share/doc/iptables/examples/x/copyright", false, true},
		{"usr/share/ca-certificates/mozilla/X.crt", "usr/share/ca-certificates/mozilla/X.crt", false, false},
	} {
		out, moved := mergedUsr(c.in)
		if out != c.out || moved != c.moved {
			t.Errorf("mergedUsr(%q) = %q, %v; want %q, %v", c.in, out, moved, c.out, c.moved)
		}
		if got := excluded(out); got != c.excluded {
			t.Errorf("excluded(%q) = %v, want %v", out, got, c.excluded)
		}
	}
}

// debOf builds the data tar of a package as dpkg-deb --fsys-tarfile prints it.
func debOf(t *testing.T, members ...tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range members {
		h.Name = "./" + h.Name
		var data []byte
		if h.Typeflag == tar.TypeReg {
			data = []byte("content of " + h.Name + "\n")
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write(data)
	}
	tw.Close()
	return buf.Bytes()
}

// TestDebTree: packages merge into one merged-/usr tree; a moved relative link still points
// where it did; alternatives, the CA bundle and the top-level links are added; a link to
// nothing, an alternative to nothing and two packages disagreeing on a file are errors.
func TestDebTree(t *testing.T) {
	dir := func(n string) tar.Header { return tar.Header{Typeflag: tar.TypeDir, Name: n + "/", Mode: 0o755} }
	reg := func(n string, mode int64) tar.Header { return tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: mode} }
	sym := func(n, target string) tar.Header {
		return tar.Header{Typeflag: tar.TypeSymlink, Name: n, Linkname: target, Mode: 0o777}
	}
	hard := func(n, target string) tar.Header {
		return tar.Header{Typeflag: tar.TypeLink, Name: n, Linkname: target}
	}
	good := [][]byte{
		debOf(t, dir("bin"), reg("bin/dash", 0o755), sym("bin/sh", "dash"), sym("bin/up", "../usr/sbin/tool"), dir("usr"), dir("usr/share"),
			dir("usr/share/man"), reg("usr/share/man/dash.1.gz", 0o644), dir("usr/share/doc"), dir("usr/share/doc/dash"),
			reg("usr/share/doc/dash/copyright", 0o644), reg("usr/share/doc/dash/changelog.gz", 0o644)),
		debOf(t, dir("usr"), dir("usr/sbin"), reg("usr/sbin/tool", 0o4755), hard("usr/sbin/tool-again", "./usr/sbin/tool"), dir("usr/share"),
			dir("usr/share/ca-certificates"), dir("usr/share/ca-certificates/b"), reg("usr/share/ca-certificates/b/two.crt", 0o644),
			reg("usr/share/ca-certificates/a.crt", 0o644), sym("usr/share/doc/tool", "dash")),
	}
	build := func(debs [][]byte, alts []Alternative) (map[string]entry, error) {
		tr := newDebTree()
		for i, d := range debs {
			if err := tr.addData(d, "pkg"+strconv.Itoa(i)); err != nil {
				return nil, err
			}
		}
		es, err := tr.finish(alts)
		m := map[string]entry{}
		for _, e := range es {
			m[e.hdr.Name] = e
		}
		return m, err
	}
	m, err := build(good, []Alternative{{Name: "tool", Link: "/sbin/thetool", Path: "/usr/sbin/tool"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"bin": "usr/bin", "sbin": "usr/sbin", "usr/bin/sh": "dash", "usr/bin/up": "/usr/sbin/tool",
		"usr/sbin/thetool": "/etc/alternatives/tool", "etc/alternatives/tool": "/usr/sbin/tool",
	} {
		if e, ok := m[name]; !ok || e.hdr.Typeflag != tar.TypeSymlink || e.hdr.Linkname != want {
			t.Errorf("/%s: %+v, want a link to %s", name, e.hdr, want)
		}
	}
	if e := m["usr/sbin/tool-again"]; e.hdr.Typeflag != tar.TypeReg || e.hdr.Mode != 0o4755 || string(e.data) != "content of ./usr/sbin/tool\n" {
		t.Errorf("hard link: %+v %q, want a copy of usr/sbin/tool (setuid kept)", e.hdr, e.data)
	}
	if b := string(m["etc/ssl/certs/ca-certificates.crt"].data); b != "content of ./usr/share/ca-certificates/a.crt\ncontent of ./usr/share/ca-certificates/b/two.crt\n" {
		t.Errorf("CA bundle %q, want a.crt then b/two.crt", b)
	}
	for _, gone := range []string{"bin/dash", "usr/share/man", "usr/share/man/dash.1.gz", "usr/share/doc/dash/changelog.gz"} {
		if _, ok := m[gone]; ok {
			t.Errorf("/%s is in the tree, want it left out", gone)
		}
	}
	for _, kept := range []string{"usr/bin/dash", "usr/share/doc/dash/copyright", "usr/share/doc/tool", "etc/alternatives", "etc/ssl/certs"} {
		if _, ok := m[kept]; !ok {
			t.Errorf("/%s is missing", kept)
		}
	}

	for name, c := range map[string]struct {
		debs [][]byte
		alts []Alternative
		want string
	}{
		"dangling link":            {[][]byte{debOf(t, dir("usr"), dir("usr/bin"), sym("usr/bin/x", "/etc/alternatives/x"))}, nil, "/usr/bin/x -> /etc/alternatives/x"},
		"alternative to nothing":   {good, []Alternative{{Name: "y", Link: "/usr/bin/y", Path: "/usr/bin/nothing"}}, "alternative y: /usr/bin/nothing"},
		"two packages, one file":   {[][]byte{good[0], debOf(t, dir("usr"), dir("usr/bin"), reg("usr/bin/dash", 0o755))}, nil, "/usr/bin/dash is in both"},
		"link over a package file": {good, []Alternative{{Name: "d", Link: "/bin/dash", Path: "/usr/sbin/tool"}}, "/usr/bin/dash is in both"},
	} {
		_, err := build(c.debs, c.alts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %q", name, err, c.want)
		}
	}
}

// testOptions are the options of the tests' builds: this checkout, the tool cache's Envoy and
// image cache (what hack/images uses).
func testOptions(t *testing.T) Options {
	t.Helper()
	tools := testenv.RequireTools(t, testenv.ToolEnvoy, testenv.ToolSPIRE)
	return Options{Root: repoRoot(t), CacheDir: filepath.Join(tools.Dir, "images"), Envoy: tools.Envoy,
		Tools: ToolPaths(tools.SPIREServer, tools.SPIREAgent, tools.SPIREControllerManager), Log: testLogger(t)}
}

// closure resolves and fetches img's closure (into the tool cache's debs/).
func closure(t *testing.T, opts Options, img Image, omit []string) ([]debPackage, []string) {
	t.Helper()
	pkgs, err := resolveDebian(context.Background(), t.TempDir(), img.Packages, omit)
	if err != nil {
		t.Fatal(err)
	}
	files, err := fetchDebs(context.Background(), filepath.Join(opts.CacheDir, "debs"), pkgs, opts.log())
	if err != nil {
		t.Fatal(err)
	}
	return pkgs, files
}

// postinstAlternatives parses the update-alternatives --install commands of a maintainer
// script: each master and its slaves, with the priority.
func postinstAlternatives(script string) map[string]struct {
	prio int
	alts []Alternative
} {
	out := map[string]struct {
		prio int
		alts []Alternative
	}{}
	script = strings.ReplaceAll(script, "\\\n", " ")
	for _, line := range strings.Split(script, "\n") {
		_, cmd, ok := strings.Cut(line, "update-alternatives ")
		if !ok {
			continue
		}
		f := strings.Fields(cmd)
		for i := 0; i < len(f); i++ {
			if f[i] != "--install" || i+4 >= len(f) {
				continue
			}
			prio, _ := strconv.Atoi(f[i+4])
			alts := []Alternative{{Link: f[i+1], Name: f[i+2], Path: f[i+3]}}
			for j := i + 5; j+3 < len(f) && f[j] == "--slave"; j += 4 {
				alts = append(alts, Alternative{Link: f[j+1], Name: f[j+2], Path: f[j+3]})
			}
			if cur, ok := out[alts[0].Name]; !ok || prio > cur.prio {
				out[alts[0].Name] = struct {
					prio int
					alts []Alternative
				}{prio, alts}
			}
		}
	}
	return out
}

// TestAlternativesAreTheMaintainerScripts: each definition's Alternatives are exactly what the
// postinst scripts of its closure register with update-alternatives --install, the highest
// priority of each name winning as on a fresh install (links to left-out documentation
// dropped). The closure's .debs are the real ones, in the tool cache.
func TestAlternativesAreTheMaintainerScripts(t *testing.T) {
	opts := testOptions(t)
	n := 0
	for _, img := range Images() {
		if len(img.Packages) == 0 {
			continue
		}
		n++
		t.Run(img.Ref, func(t *testing.T) {
			var omit []string
			for p := range img.Omit {
				omit = append(omit, p)
			}
			_, files := closure(t, opts, img, omit)
			var want []Alternative
			for _, f := range files {
				ctrl, err := exec.Command("dpkg-deb", "--ctrl-tarfile", f).Output()
				if err != nil {
					t.Fatalf("dpkg-deb --ctrl-tarfile %s: %v", f, err)
				}
				eachMember(t, bytes.NewReader(ctrl), func(h *tar.Header, content io.Reader) {
					if strings.TrimPrefix(h.Name, "./") != "postinst" {
						return
					}
					b, _ := io.ReadAll(content)
					for _, v := range postinstAlternatives(string(b)) {
						for _, a := range v.alts {
							name, _ := mergedUsr(strings.TrimPrefix(a.Path, "/"))
							if !excluded(name) {
								want = append(want, a)
							}
						}
					}
				})
			}
			got := append([]Alternative(nil), img.Alternatives...)
			byName := func(a, b Alternative) int { return strings.Compare(a.Name, b.Name) }
			slices.SortFunc(want, byName)
			slices.SortFunc(got, byName)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Alternatives (-maintainer scripts +definition):\n%s", diff)
			}
		})
	}
	if n == 0 {
		t.Fatal("no definition has Debian packages")
	}
}

// TestOmittedPackagesAreInTheClosure: every package a definition omits is one apt would
// install (no stale Omit entry), and is not in the closure Build uses.
func TestOmittedPackagesAreInTheClosure(t *testing.T) {
	for _, img := range Images() {
		if len(img.Omit) == 0 {
			continue
		}
		t.Run(img.Ref, func(t *testing.T) {
			full, err := resolveDebian(context.Background(), t.TempDir(), img.Packages, nil)
			if err != nil {
				t.Fatal(err)
			}
			var omit []string
			for p := range img.Omit {
				omit = append(omit, p)
			}
			less, err := resolveDebian(context.Background(), t.TempDir(), img.Packages, omit)
			if err != nil {
				t.Fatal(err)
			}
			names := func(ps []debPackage) []string {
				var out []string
				for _, p := range ps {
					out = append(out, p.Name)
				}
				return out
			}
			for p, why := range img.Omit {
				if why == "" {
					t.Errorf("Omit[%q] says not why it is safe", p)
				}
				if !slices.Contains(names(full), p) {
					t.Errorf("Omit[%q]: apt does not install it for %v (stale entry)", p, img.Packages)
				}
				if slices.Contains(names(less), p) {
					t.Errorf("Omit[%q]: still in the closure", p)
				}
			}
			t.Logf("%d packages, %d with nothing omitted", len(less), len(full))
		})
	}
}
