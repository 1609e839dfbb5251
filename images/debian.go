package images

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// DebianRelease is the Debian release of the images' packages: this machine's, whose apt
// resolves and downloads them, and the Dockerfiles' debian:bookworm-slim.
const DebianRelease = "bookworm"

// debianLayerFormat changes whenever the way a closure becomes a layer changes (what is left
// out, the links and files made for maintainer scripts), so that no cached layer of the old
// format is reused. TestBuildIsReproducible builds without the cache and fails when a cached
// layer differs.
const debianLayerFormat = "1"

// Alternative is one link Debian's update-alternatives makes when a package's maintainer
// script registers it, as a fresh install leaves it (the highest priority wins): Link points to
// /etc/alternatives/Name, which points to Path. Maintainer scripts do not run in an image
// build, so an image's definition names its alternatives.
type Alternative struct {
	Name string
	Link string
	Path string
}

// debPackage is one package of a dependency closure, as apt resolved it.
type debPackage struct {
	Name, Version, Arch string
}

// file is the name apt-get download gives the package's .deb (an epoch's colon is %3a).
func (p debPackage) file() string {
	return p.Name + "_" + strings.ReplaceAll(p.Version, ":", "%3a") + "_" + p.Arch + ".deb"
}

// instLine is a line of apt-get -s install: "Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64]) []".
var instLine = regexp.MustCompile(`^Inst (\S+) (?:\[\S+\] )?\((\S+) .*\[([a-z0-9]+)\]\)`)

// parseSimulation returns the packages apt-get -s install would install, in its order.
func parseSimulation(out []byte) []debPackage {
	var pkgs []debPackage
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := instLine.FindStringSubmatch(sc.Text()); m != nil {
			pkgs = append(pkgs, debPackage{Name: m[1], Version: m[2], Arch: m[3]})
		}
	}
	return pkgs
}

// output runs an apt or dpkg command (in dir, "" for the current one) with a fixed locale and
// returns its standard output; the error carries the command and its standard error.
func output(ctx context.Context, dir string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// resolveDebian returns the dependency closure of pkgs (Depends and Pre-Depends, no
// Recommends) that apt would install on an empty system, with the candidate versions of this
// machine's apt lists. Packages in omit count as installed already: they are left out, and so
// is what only they depend on. It runs apt-get -s with a dpkg status file that lists omit
// alone, so it needs no root and changes nothing.
func resolveDebian(ctx context.Context, tmp string, pkgs, omit []string) ([]debPackage, error) {
	var status bytes.Buffer
	if len(omit) > 0 {
		out, err := output(ctx, tmp, "apt-cache", append([]string{"show", "--no-all-versions"}, omit...)...)
		if err != nil {
			return nil, fmt.Errorf("resolve Debian packages: omitted packages: %w", err)
		}
		status.Write(statusOf(out))
	}
	sf := filepath.Join(tmp, "status")
	if err := os.WriteFile(sf, status.Bytes(), 0o644); err != nil {
		return nil, err
	}
	args := []string{"-s", "-o", "Dir::State::status=" + sf, "-o", "APT::Install-Recommends=false",
		"-o", "APT::Install-Suggests=false", "-o", "Debug::NoLocking=true", "install", "--"}
	out, err := output(ctx, tmp, "apt-get", append(args, pkgs...)...)
	if err != nil {
		return nil, fmt.Errorf("resolve Debian packages (is apt-get update done?): %w", err)
	}
	got := parseSimulation(out)
	if len(got) == 0 {
		return nil, fmt.Errorf("resolve Debian packages %v: apt-get -s installs nothing", pkgs)
	}
	return got, nil
}

// aptState lists what apt's answer depends on besides the packages asked for: the name, size
// and modification time of every file under /etc/apt (sources, preferences, configuration) and
// /var/lib/apt/lists (the package lists apt-get update fetched).
func aptState() (string, error) {
	var b strings.Builder
	for _, root := range []string{"/etc/apt", "/var/lib/apt/lists"} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Type().IsRegular() {
				info, err := d.Info()
				if err != nil {
					return err
				}
				fmt.Fprintf(&b, "%s %d %d\n", p, info.Size(), info.ModTime().UnixNano())
			}
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("read apt state: %w", err)
		}
	}
	return b.String(), nil
}

// resolveCached is resolveDebian, its answer kept in dir for as long as apt's state (aptState)
// and the question stay the same: apt-get -s takes seconds, a look-up nothing.
func resolveCached(ctx context.Context, dir, tmp string, pkgs, omit []string) ([]debPackage, error) {
	state, err := aptState()
	if err != nil {
		return nil, err
	}
	key := sha256.New()
	fmt.Fprintf(key, "packages %q\nomit %q\n%s", pkgs, omit, state)
	file := filepath.Join(dir, "resolved-"+hex.EncodeToString(key.Sum(nil)))
	if b, err := os.ReadFile(file); err == nil {
		var got []debPackage
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if f := strings.Fields(line); len(f) == 3 {
				got = append(got, debPackage{Name: f[0], Version: f[1], Arch: f[2]})
			}
		}
		if len(got) > 0 {
			return got, nil
		}
	}
	got, err := resolveDebian(ctx, tmp, pkgs, omit)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	for _, p := range got {
		fmt.Fprintf(&b, "%s %s %s\n", p.Name, p.Version, p.Arch)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return got, writeFileAtomic(file, []byte(b.String()))
}

// statusOf turns apt-cache show's stanzas into dpkg status stanzas of installed packages.
func statusOf(show []byte) []byte {
	var out bytes.Buffer
	for _, stanza := range strings.Split(strings.TrimSpace(string(show)), "\n\n") {
		var fields []string
		for _, line := range strings.Split(stanza, "\n") {
			k, _, _ := strings.Cut(line, ":")
			switch k {
			case "Package":
				fields = append(fields, line, "Status: install ok installed")
			case "Version", "Architecture", "Multi-Arch", "Provides":
				fields = append(fields, line)
			}
		}
		out.WriteString(strings.Join(fields, "\n") + "\n\n")
	}
	return out.Bytes()
}

// fetchDebs returns the paths of pkgs' .deb files in dir, downloading with apt-get download
// (which checks them against the signed apt lists) those dir does not hold yet.
func fetchDebs(ctx context.Context, dir string, pkgs []debPackage, log *slog.Logger) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("download Debian packages: %w", err)
	}
	var paths, missing []string
	var want []debPackage
	for _, p := range pkgs {
		f := filepath.Join(dir, p.file())
		paths = append(paths, f)
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, p.Name+"="+p.Version)
			want = append(want, p)
		}
	}
	if len(missing) == 0 {
		return paths, nil
	}
	start := time.Now()
	tmp, err := os.MkdirTemp(dir, ".download-")
	if err != nil {
		return nil, fmt.Errorf("download Debian packages: %w", err)
	}
	defer os.RemoveAll(tmp)
	args := []string{"download"}
	if os.Geteuid() == 0 {
		// apt drops root to _apt for downloads, and _apt cannot write here.
		args = append(args, "-o", "APT::Sandbox::User=root")
	}
	if _, err := output(ctx, tmp, "apt-get", append(args, missing...)...); err != nil {
		return nil, fmt.Errorf("download Debian packages: %w", err)
	}
	for _, p := range want {
		if err := os.Rename(filepath.Join(tmp, p.file()), filepath.Join(dir, p.file())); err != nil {
			return nil, fmt.Errorf("download Debian packages: %s: %w", p.Name, err)
		}
	}
	log.Info("downloaded Debian packages", "count", len(want), "dir", dir, "seconds", time.Since(start).Seconds())
	return paths, nil
}

// mergedUsrDirs are the top-level directories that are links into /usr on a merged-/usr system
// (Debian's default since bookworm, and debian:bookworm-slim's layout).
var mergedUsrDirs = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// mergedUsr maps a member name (relative, cleaned) to its place on a merged-/usr system:
// "bin/sh" is "usr/bin/sh". moved says whether it changed.
func mergedUsr(name string) (string, bool) {
	top, _, _ := strings.Cut(name, "/")
	for _, d := range mergedUsrDirs {
		if top == d {
			return "usr/" + name, true
		}
	}
	return name, false
}

// excludedDocs are what debian:bookworm-slim's dpkg configuration leaves out
// (/etc/dpkg/dpkg.cfg.d/docker): manual pages, info, translations, lintian overrides; of
// /usr/share/doc only each package's copyright stays.
var excludedDocs = []string{"usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/groff",
	"usr/share/lintian", "usr/share/linda"}

// excluded reports whether a member name (after mergedUsr) is left out of the layer.
func excluded(name string) bool {
	for _, d := range excludedDocs {
		if name == d || strings.HasPrefix(name, d+"/") {
			return true
		}
	}
	rest, ok := strings.CutPrefix(name, "usr/share/doc/")
	if !ok {
		return false
	}
	pkg, file, nested := strings.Cut(rest, "/")
	return pkg != "" && nested && file != "copyright"
}

// debTree is the merged file tree of a closure's packages, keyed by member name.
type debTree struct {
	m     map[string]*entry
	owner map[string]string // member name → package
}

func newDebTree() *debTree { return &debTree{m: map[string]*entry{}, owner: map[string]string{}} }

// addDeb adds the files of a .deb (dpkg-deb --fsys-tarfile) to t, each at its merged-/usr
// place, docs left out. Hard links become copies. A member that another package already put
// there differently is an error naming both packages.
func (t *debTree) addDeb(ctx context.Context, file string) error {
	pkg := filepath.Base(file)
	out, err := output(ctx, "", "dpkg-deb", "--fsys-tarfile", file)
	if err != nil {
		return fmt.Errorf("extract %s: %w", pkg, err)
	}
	return t.addData(out, pkg)
}

// addData adds the members of a package's data tar (pkg names it in errors).
func (t *debTree) addData(data []byte, pkg string) error {
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("extract %s: %w", pkg, err)
		}
		orig := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if orig == "" {
			continue
		}
		name, moved := mergedUsr(orig)
		if excluded(name) {
			continue
		}
		e := &entry{hdr: tar.Header{Name: name, Typeflag: h.Typeflag, Mode: h.Mode & 0o7777,
			Uid: h.Uid, Gid: h.Gid, Uname: h.Uname, Gname: h.Gname}}
		switch h.Typeflag {
		case tar.TypeDir:
		case tar.TypeReg:
			if e.data, err = io.ReadAll(tr); err != nil {
				return fmt.Errorf("extract %s: %s: %w", pkg, orig, err)
			}
			e.hdr.Size = int64(len(e.data))
		case tar.TypeSymlink:
			e.hdr.Linkname = h.Linkname
			if moved && !path.IsAbs(h.Linkname) && strings.Contains(h.Linkname, "..") {
				// Relative to the old place; the absolute target resolves the same from the new one.
				e.hdr.Linkname = path.Join("/", path.Dir(orig), h.Linkname)
			}
		case tar.TypeLink:
			target, _ := mergedUsr(strings.TrimPrefix(path.Clean("/"+h.Linkname), "/"))
			src, ok := t.m[target]
			if !ok || src.hdr.Typeflag != tar.TypeReg {
				return fmt.Errorf("extract %s: hard link %s to %s, which is not a file before it", pkg, orig, h.Linkname)
			}
			e.hdr.Typeflag, e.hdr.Mode, e.data, e.hdr.Size = tar.TypeReg, src.hdr.Mode, src.data, src.hdr.Size
		default:
			return fmt.Errorf("extract %s: %s: unsupported tar member type %q", pkg, orig, h.Typeflag)
		}
		if err := t.put(e, pkg); err != nil {
			return err
		}
	}
}

// put adds e (from pkg) unless an equal member is there; directories keep the first one's mode.
func (t *debTree) put(e *entry, pkg string) error {
	name := e.hdr.Name
	if old, ok := t.m[name]; ok {
		same := old.hdr.Typeflag == e.hdr.Typeflag && old.hdr.Linkname == e.hdr.Linkname && bytes.Equal(old.data, e.data)
		if !same {
			return fmt.Errorf("debian layer: /%s is in both %s and %s, differently", name, t.owner[name], pkg)
		}
		return nil
	}
	t.m[name], t.owner[name] = e, pkg
	return nil
}

// resolve follows p (absolute) through t's symbolic links and returns the member it ends at,
// or nil when a component is missing. The root is a directory member of its own.
func (t *debTree) resolve(p string) *entry {
	parts := strings.Split(p, "/")
	cur := ""
	for hops := 0; len(parts) > 0; {
		part := parts[0]
		parts = parts[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			if cur = path.Dir(cur); cur == "." {
				cur = ""
			}
			continue
		}
		next := path.Join(cur, part)
		e, ok := t.m[next]
		if !ok {
			return nil
		}
		if e.hdr.Typeflag == tar.TypeSymlink {
			if hops++; hops > 40 {
				return nil
			}
			if path.IsAbs(e.hdr.Linkname) {
				cur = ""
			}
			parts = append(strings.Split(e.hdr.Linkname, "/"), parts...)
			continue
		}
		cur = next
	}
	if cur == "" {
		return &entry{hdr: tar.Header{Typeflag: tar.TypeDir}}
	}
	return t.m[cur]
}

// finish adds what maintainer scripts would have made and a merged-/usr system has, checks that
// every symbolic link resolves, and returns the members, parent directories included:
//   - /bin, /sbin, /lib, /lib64 (those that have content) as links into /usr;
//   - alts: the update-alternatives links;
//   - /etc/ssl/certs/ca-certificates.crt when ca-certificates is there: its postinst runs
//     update-ca-certificates, which concatenates every certificate under
//     /usr/share/ca-certificates (all enabled on a fresh install) in name order, each ending in
//     a newline; this bundle is the file Go's crypto/x509 and OpenSSL read.
func (t *debTree) finish(alts []Alternative) ([]entry, error) {
	for _, d := range mergedUsrDirs {
		if _, ok := t.m["usr/"+d]; ok {
			if err := t.put(&entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: d, Linkname: "usr/" + d, Mode: 0o777}}, "merged /usr"); err != nil {
				return nil, err
			}
		}
	}
	for _, a := range alts {
		if !path.IsAbs(a.Link) || !path.IsAbs(a.Path) || a.Name == "" || strings.Contains(a.Name, "/") {
			return nil, fmt.Errorf("alternative %q: want a name, an absolute Link and Path, got %q -> %q", a.Name, a.Link, a.Path)
		}
		if e := t.resolve(a.Path); e == nil || e.hdr.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("alternative %s: %s is not a file of the closure", a.Name, a.Path)
		}
		link, _ := mergedUsr(strings.TrimPrefix(path.Clean(a.Link), "/"))
		for _, e := range []*entry{
			{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: link, Linkname: "/etc/alternatives/" + a.Name, Mode: 0o777}},
			{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "etc/alternatives/" + a.Name, Linkname: a.Path, Mode: 0o777}},
		} {
			if err := t.put(e, "alternative "+a.Name); err != nil {
				return nil, err
			}
		}
	}
	var certs []string
	for name, e := range t.m {
		if rest, ok := strings.CutPrefix(name, "usr/share/ca-certificates/"); ok && strings.HasSuffix(rest, ".crt") && e.hdr.Typeflag == tar.TypeReg {
			certs = append(certs, name)
		}
	}
	if len(certs) > 0 {
		sort.Strings(certs)
		var bundle []byte
		for _, c := range certs {
			bundle = append(bundle, t.m[c].data...)
			if !bytes.HasSuffix(bundle, []byte("\n")) {
				bundle = append(bundle, '\n')
			}
		}
		e := &entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "etc/ssl/certs/ca-certificates.crt", Mode: 0o644, Size: int64(len(bundle))}, data: bundle}
		if err := t.put(e, "update-ca-certificates"); err != nil {
			return nil, err
		}
	}
	all := make([]entry, 0, len(t.m))
	for _, e := range t.m {
		all = append(all, *e)
	}
	all = withParents(all)
	for i := range all {
		t.m[all[i].hdr.Name] = &all[i]
	}
	var dangling []string
	for name, e := range t.m {
		if e.hdr.Typeflag != tar.TypeSymlink || strings.HasPrefix(name, "usr/share/doc/") {
			continue
		}
		target := e.hdr.Linkname
		if !path.IsAbs(target) {
			target = path.Join("/", path.Dir(name), target)
		}
		if t.resolve(target) == nil {
			dangling = append(dangling, "/"+name+" -> "+e.hdr.Linkname)
		}
	}
	if len(dangling) > 0 {
		sort.Strings(dangling)
		return nil, fmt.Errorf("debian layer: links to nothing in the closure (a missing package or alternative?): %s", strings.Join(dangling, ", "))
	}
	return all, nil
}

// checkRelease fails unless this machine runs DebianRelease (its apt resolves the packages).
func checkRelease() error {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return fmt.Errorf("debian packages: %w", err)
	}
	codename := ""
	if m := regexp.MustCompile(`(?m)^VERSION_CODENAME=(\S+)$`).FindSubmatch(b); m != nil {
		codename = string(m[1])
	}
	if codename != DebianRelease {
		return fmt.Errorf("debian packages: this machine is not Debian %s (/etc/os-release VERSION_CODENAME=%q); the images hold %s's packages", DebianRelease, codename, DebianRelease)
	}
	return nil
}

// debianLayer returns the layer of img's Debian closure: resolved with apt, the .debs fetched
// into opts.CacheDir/debs once, extracted with dpkg-deb. The layer is cached by the exact
// package files and alternatives, so that an unchanged closure is neither extracted nor
// compressed again.
func debianLayer(ctx context.Context, opts Options, cache layerCache, img Image) (v1.Layer, error) {
	if err := checkRelease(); err != nil {
		return nil, err
	}
	omit := make([]string, 0, len(img.Omit))
	for p := range img.Omit {
		omit = append(omit, p)
	}
	sort.Strings(omit)
	tmp, err := os.MkdirTemp("", "aether-images-apt-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	pkgs, err := resolveCached(ctx, filepath.Join(opts.CacheDir, "debs"), tmp, img.Packages, omit)
	if err != nil {
		return nil, err
	}
	files, err := fetchDebs(ctx, filepath.Join(opts.CacheDir, "debs"), pkgs, opts.log())
	if err != nil {
		return nil, err
	}
	key := sha256.New()
	fmt.Fprintf(key, "format %s\n", debianLayerFormat)
	for _, p := range pkgs {
		fmt.Fprintf(key, "deb %s\n", p.file())
	}
	for _, a := range img.Alternatives {
		fmt.Fprintf(key, "alternative %s %s %s\n", a.Name, a.Link, a.Path)
	}
	keyFile := filepath.Join(cache.dir, "debian-"+hex.EncodeToString(key.Sum(nil)))
	if b, err := os.ReadFile(keyFile); err == nil {
		if h, err := v1.NewHash(strings.TrimSpace(string(b))); err == nil {
			if l, err := cache.layerByDiffID(h, nil); err == nil && l != nil {
				now := time.Now() // in use: prune keeps it
				_ = os.Chtimes(keyFile, now, now)
				return l, nil
			}
		}
	}
	start := time.Now()
	t := newDebTree()
	for _, f := range files {
		if err := t.addDeb(ctx, f); err != nil {
			return nil, err
		}
	}
	es, err := t.finish(img.Alternatives)
	if err != nil {
		return nil, err
	}
	l, err := cache.layer(func(w io.Writer) error { return writeLayer(w, es) })
	if err != nil {
		return nil, fmt.Errorf("debian layer: %w", err)
	}
	diffID, err := l.DiffID()
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(keyFile, []byte(diffID.String()+"\n")); err != nil {
		return nil, err
	}
	opts.log().Info("debian layer", "image", img.Ref, "packages", len(pkgs), "files", len(es), "seconds", time.Since(start).Seconds())
	return l, nil
}
