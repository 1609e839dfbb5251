package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of an image layer: Src on this machine, copied to Dst (an absolute path in
// the image) with Mode (0 keeps Src's permission bits). A Src that is a symbolic link is
// stored as the file it points to.
type File struct {
	Src  string
	Dst  string
	Mode os.FileMode
}

// Link is a symbolic link in an image layer: Dst points to Target.
type Link struct {
	Dst    string
	Target string
}

// Layer is the content of one image layer.
type Layer struct {
	Files []File
	Links []Link
}

// Config is what an image runs: the OCI image config's Entrypoint, Cmd, Env and WorkingDir
// (OCI image-spec config.md).
type Config struct {
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
}

// epoch is every layer file's modification time, so that the same inputs give the same digest.
var epoch = time.Unix(0, 0).UTC()

// BuildImage assembles a linux/amd64 image from layers (base first) with config, reproducibly:
// file order, times, owners and the image's created time are fixed, so the same inputs give the
// same digest. Parent directories of every file are created (0755, root). Errors name the file.
func BuildImage(layers []Layer, cfg Config) (v1.Image, error) {
	img := empty.Image
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for i, l := range layers {
		b, err := layerTar(l)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(b)), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		img, err = mutate.AppendLayers(img, layer)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: epoch}
	env := cfg.Env
	if len(env) == 0 {
		env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	cf.Config = v1.Config{Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd, Env: env, WorkingDir: cfg.WorkingDir}
	return mutate.ConfigFile(img, cf)
}

// layerTar writes l as an uncompressed tar: directories first, then files and links, each
// sorted by path.
func layerTar(l Layer) ([]byte, error) {
	dirs := map[string]bool{}
	addParents := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	files := append([]File(nil), l.Files...)
	for i, f := range files {
		if !path.IsAbs(f.Dst) {
			return nil, fmt.Errorf("file %q: destination %q is not absolute", f.Src, f.Dst)
		}
		files[i].Dst = path.Clean(f.Dst)
		addParents(files[i].Dst)
	}
	for _, ln := range l.Links {
		if !path.IsAbs(ln.Dst) {
			return nil, fmt.Errorf("link %q: destination is not absolute", ln.Dst)
		}
		addParents(path.Clean(ln.Dst))
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Dst < files[j].Dst })
	var dl []string
	for d := range dirs {
		dl = append(dl, d)
	}
	sort.Strings(dl)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dl {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/",
			Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, fmt.Errorf("file %q for %q: %w", f.Src, f.Dst, err)
		}
		mode := f.Mode
		if mode == 0 {
			st, err := os.Stat(f.Src)
			if err != nil {
				return nil, err
			}
			mode = st.Mode().Perm()
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Dst, "/"),
			Mode: int64(mode.Perm()), Size: int64(len(b)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	links := append([]Link(nil), l.Links...)
	sort.Slice(links, func(i, j int) bool { return links[i].Dst < links[j].Dst })
	for _, ln := range links {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(path.Clean(ln.Dst), "/"),
			Linkname: ln.Target, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
