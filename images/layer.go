package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
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

// Dir is a directory in an image layer with its mode (permission bits, sticky bit included:
// /tmp is 01777). Parent directories of files and links need no Dir: they are 0755.
type Dir struct {
	Path string
	Mode os.FileMode
}

// Layer is the content of one image layer.
type Layer struct {
	Files []File
	Links []Link
	Dirs  []Dir
}

// Config is what an image runs: the OCI image config's Entrypoint, Cmd, Env, User and
// WorkingDir (OCI image-spec config.md). An empty Env is PATH alone (Debian's default PATH).
type Config struct {
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
	WorkingDir string
}

// defaultPath is the PATH of an image whose Config sets no Env (debian:bookworm-slim's).
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// epoch is every layer member's modification time and the image's created time, so that the
// same inputs give the same digest.
var epoch = time.Unix(0, 0).UTC()

// BuildImage assembles a linux/amd64 image from layers (base first) with cfg, reproducibly:
// member order, times and owners and the image's created time are fixed, so the same inputs
// give the same digest. Parent directories of every file and link are created (0755, root).
// The layers are gzip-compressed in memory (Build caches them on disk instead). Errors name
// the layer and the file.
func BuildImage(layers []Layer, cfg Config) (v1.Image, error) {
	var ls []v1.Layer
	for i, l := range layers {
		es, err := l.entries()
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		var buf bytes.Buffer
		if err := writeLayer(&buf, es); err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		b := buf.Bytes()
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(b)), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		ls = append(ls, layer)
	}
	return assemble(ls, cfg)
}

// assemble makes a linux/amd64 OCI image of layers (base first) running cfg, created at epoch.
func assemble(layers []v1.Layer, cfg Config) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
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
		env = []string{defaultPath}
	}
	cf.Config = v1.Config{Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd, Env: env, User: cfg.User, WorkingDir: cfg.WorkingDir}
	return mutate.ConfigFile(img, cf)
}

// entry is one member of a layer tar: its header (Name relative to the root, without a
// trailing slash) and its content, data or the file src (Size bytes).
type entry struct {
	hdr  tar.Header
	data []byte
	src  string
}

// entries returns l's members, parent directories included.
func (l Layer) entries() ([]entry, error) {
	byName := map[string]entry{}
	add := func(e entry) error {
		if old, ok := byName[e.hdr.Name]; ok && (old.hdr.Typeflag != tar.TypeDir || e.hdr.Typeflag != tar.TypeDir) {
			return fmt.Errorf("%q is in the layer twice", "/"+e.hdr.Name)
		}
		byName[e.hdr.Name] = e
		return nil
	}
	rel := func(kind, p string) (string, error) {
		if !path.IsAbs(p) || path.Clean(p) == "/" {
			return "", fmt.Errorf("%s %q: want an absolute path below /", kind, p)
		}
		return strings.TrimPrefix(path.Clean(p), "/"), nil
	}
	for _, d := range l.Dirs {
		name, err := rel("directory", d.Path)
		if err != nil {
			return nil, err
		}
		if err := add(entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: tarMode(d.Mode)}}); err != nil {
			return nil, err
		}
	}
	for _, f := range l.Files {
		name, err := rel("file "+f.Src+": destination", f.Dst)
		if err != nil {
			return nil, err
		}
		st, err := os.Stat(f.Src)
		if err != nil {
			return nil, fmt.Errorf("file %q for %q: %w", f.Src, f.Dst, err)
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("file %q for %q: not a regular file", f.Src, f.Dst)
		}
		mode := f.Mode
		if mode == 0 {
			mode = st.Mode().Perm()
		}
		if err := add(entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: tarMode(mode), Size: st.Size()}, src: f.Src}); err != nil {
			return nil, err
		}
	}
	for _, ln := range l.Links {
		name, err := rel("link", ln.Dst)
		if err != nil {
			return nil, err
		}
		if ln.Target == "" {
			return nil, fmt.Errorf("link %q: empty target", ln.Dst)
		}
		if err := add(entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: ln.Target, Mode: 0o777}}); err != nil {
			return nil, err
		}
	}
	es := make([]entry, 0, len(byName))
	for _, e := range byName {
		es = append(es, e)
	}
	return withParents(es), nil
}

// tarMode converts a Go file mode to tar's mode bits (permissions, setuid, setgid, sticky).
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// withParents adds the missing parent directories of es (0755, root).
func withParents(es []entry) []entry {
	have := map[string]bool{}
	for _, e := range es {
		have[e.hdr.Name] = true
	}
	for _, e := range es {
		for d := path.Dir(e.hdr.Name); d != "."; d = path.Dir(d) {
			if !have[d] {
				have[d] = true
				es = append(es, entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}})
			}
		}
	}
	return es
}

// writeLayer writes es as an uncompressed tar, sorted by name (so a directory comes before what
// it holds), every member's time set to epoch.
func writeLayer(w io.Writer, es []entry) error {
	sorted := append([]entry(nil), es...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].hdr.Name < sorted[j].hdr.Name })
	tw := tar.NewWriter(w)
	for _, e := range sorted {
		h := e.hdr
		h.ModTime, h.AccessTime, h.ChangeTime = epoch, time.Time{}, time.Time{}
		h.PAXRecords, h.Format = nil, tar.FormatPAX
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		if err := tw.WriteHeader(&h); err != nil {
			return fmt.Errorf("write %s: %w", h.Name, err)
		}
		switch {
		case e.src != "":
			f, err := os.Open(e.src)
			if err != nil {
				return fmt.Errorf("write %s: %w", h.Name, err)
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return fmt.Errorf("write %s from %s: %w", h.Name, e.src, err)
			}
		case len(e.data) > 0:
			if _, err := tw.Write(e.data); err != nil {
				return fmt.Errorf("write %s: %w", h.Name, err)
			}
		}
	}
	return tw.Close()
}

// layerCache keeps gzip-compressed layer blobs in dir, found by their diff ID (the sha256 of
// the uncompressed tar), so that an unchanged layer is hashed but never compressed again:
// dir/<diff ID hex>.json names the blob dir/<digest hex>.tar.gz and its size.
type layerCache struct{ dir string }

// cachedBlob is the record dir/<diff ID hex>.json.
type cachedBlob struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	// Unpacked is the uncompressed tar's size in bytes.
	Unpacked int64 `json:"unpacked"`
}

// layer returns the layer whose uncompressed tar write produces. write is called once to hash
// the tar and, when the cache does not hold it yet, once more to compress it.
func (c layerCache) layer(write func(io.Writer) error) (v1.Layer, error) {
	h := sha256.New()
	if err := write(h); err != nil {
		return nil, err
	}
	diffID := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	return c.layerByDiffID(diffID, write)
}

// layerByDiffID returns the cached layer of diffID, compressing write's tar into the cache
// first when it is not there (write nil: only look, returning nil when absent).
func (c layerCache) layerByDiffID(diffID v1.Hash, write func(io.Writer) error) (v1.Layer, error) {
	rec := filepath.Join(c.dir, diffID.Hex+".json")
	if b, err := os.ReadFile(rec); err == nil {
		var cb cachedBlob
		if json.Unmarshal(b, &cb) == nil {
			if d, err := v1.NewHash(cb.Digest); err == nil {
				blob := filepath.Join(c.dir, d.Hex+".tar.gz")
				if st, err := os.Stat(blob); err == nil && st.Size() == cb.Size {
					now := time.Now() // in use: prune keeps it
					_ = os.Chtimes(blob, now, now)
					_ = os.Chtimes(rec, now, now)
					return &cachedLayer{blob: blob, digest: d, diffID: diffID, size: cb.Size, unpacked: cb.Unpacked}, nil
				}
			}
		}
	}
	if write == nil {
		return nil, nil
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("layer cache: %w", err)
	}
	tmp, err := os.CreateTemp(c.dir, ".layer-*")
	if err != nil {
		return nil, fmt.Errorf("layer cache: %w", err)
	}
	defer os.Remove(tmp.Name())
	dh, uh := sha256.New(), sha256.New()
	n, un := &countWriter{}, &countWriter{}
	gz, _ := gzip.NewWriterLevel(io.MultiWriter(tmp, dh, n), gzip.BestSpeed)
	err = write(io.MultiWriter(gz, uh, un))
	if err == nil {
		err = gz.Close()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("layer cache: %w", err)
	}
	if got := hex.EncodeToString(uh.Sum(nil)); got != diffID.Hex {
		return nil, fmt.Errorf("layer cache: the layer's content changed while it was written (sha256 %s, then %s)", diffID.Hex, got)
	}
	d := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(dh.Sum(nil))}
	blob := filepath.Join(c.dir, d.Hex+".tar.gz")
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return nil, fmt.Errorf("layer cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), blob); err != nil {
		return nil, fmt.Errorf("layer cache: %w", err)
	}
	b, _ := json.Marshal(cachedBlob{Digest: d.String(), Size: n.n, Unpacked: un.n})
	if err := writeFileAtomic(rec, b); err != nil {
		return nil, fmt.Errorf("layer cache: %w", err)
	}
	return &cachedLayer{blob: blob, digest: d, diffID: diffID, size: n.n, unpacked: un.n}, nil
}

// layerCacheAge is how long a cached layer no build used stays (prune).
const layerCacheAge = 7 * 24 * time.Hour

// prune deletes the cache's files that no build used for layerCacheAge: every change of a
// binary adds a layer, and the old ones are rarely wanted again.
func (c layerCache) prune() error {
	des, err := os.ReadDir(c.dir)
	if err != nil {
		return err
	}
	for _, de := range des {
		info, err := de.Info()
		if err == nil && info.Mode().IsRegular() && time.Since(info.ModTime()) > layerCacheAge {
			if err := os.Remove(filepath.Join(c.dir, de.Name())); err != nil && !os.IsNotExist(err) {
				return err
			}
		}
	}
	return nil
}

// writeFileAtomic writes b to name through a temporary file and a rename, so that a reader
// never sees half of it.
func writeFileAtomic(name string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), name)
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(b []byte) (int, error) { c.n += int64(len(b)); return len(b), nil }

// cachedLayer is a gzip-compressed OCI layer blob on disk with its known digests and sizes.
type cachedLayer struct {
	blob           string
	digest, diffID v1.Hash
	size, unpacked int64
}

func (l *cachedLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *cachedLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *cachedLayer) Size() (int64, error)                { return l.size, nil }
func (l *cachedLayer) MediaType() (types.MediaType, error) { return types.OCILayer, nil }
func (l *cachedLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.blob) }

// Uncompressed returns the layer's tar.
func (l *cachedLayer) Uncompressed() (io.ReadCloser, error) {
	f, err := os.Open(l.blob)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("layer %s: %w", l.blob, err)
	}
	return readCloser{Reader: zr, close: func() error { zr.Close(); return f.Close() }}, nil
}

type readCloser struct {
	io.Reader
	close func() error
}

func (r readCloser) Close() error { return r.close() }

var _ v1.Layer = (*cachedLayer)(nil)

// Size returns img's size in bytes: compressed (its manifest, config and layer blobs, what a
// push sends and a registry stores) and unpacked (the layers' uncompressed tars, about what the
// unpacked root file system takes on disk). Layers Build made know their unpacked size; others
// are decompressed to count it.
func Size(img v1.Image) (compressed, unpacked int64, err error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, 0, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, 0, err
	}
	compressed = int64(len(raw)) + m.Config.Size
	ls, err := img.Layers()
	if err != nil {
		return 0, 0, err
	}
	for _, l := range ls {
		n, err := l.Size()
		if err != nil {
			return 0, 0, err
		}
		compressed += n
		u, err := unpackedSize(l)
		if err != nil {
			return 0, 0, err
		}
		unpacked += u
	}
	return compressed, unpacked, nil
}

// unpackedSize is the size of l's uncompressed tar.
func unpackedSize(l v1.Layer) (int64, error) {
	if c, ok := l.(*cachedLayer); ok {
		return c.unpacked, nil
	}
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	return io.Copy(io.Discard, rc)
}
