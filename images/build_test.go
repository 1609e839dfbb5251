package images

import (
	"archive/tar"
	"context"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// testWriter sends log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func testLogger(t *testing.T) *slog.Logger { return slog.New(slog.NewTextHandler(testWriter{t}, nil)) }

var (
	builtOnce sync.Once
	built     map[string]v1.Image
	builtErr  error
)

// builtImages builds every image once per test binary (the tool cache's image cache makes it
// cheap after the first time on a machine) and returns them by Ref.
func builtImages(t *testing.T) map[string]v1.Image {
	t.Helper()
	opts := testOptions(t)
	builtOnce.Do(func() {
		opts.Log = nil // t's logger would outlive t
		var bs []Built
		bs, builtErr = Build(context.Background(), opts, Images())
		built = map[string]v1.Image{}
		for _, b := range bs {
			built[b.Ref] = b.Image
		}
	})
	if builtErr != nil {
		t.Fatal(builtErr)
	}
	return built
}

// imageFiles reads img's flattened file system: member name (no leading "/") → header, and
// the content of the regular files named in read.
func imageFiles(t *testing.T, img v1.Image, read ...string) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	eachMember(t, rc, func(h *tar.Header, content io.Reader) {
		name := strings.TrimSuffix(strings.TrimPrefix(h.Name, "/"), "/")
		hdrs[name] = h
		for _, r := range read {
			if r == name {
				b, err := io.ReadAll(content)
				if err != nil {
					t.Fatal(err)
				}
				data[name] = b
			}
		}
	})
	return hdrs, data
}

// eachMember calls fn with every member of the tar r and its content, failing t when r is no
// tar.
func eachMember(t *testing.T, r io.Reader, fn func(h *tar.Header, content io.Reader)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(h, tr)
	}
}

// TestBuildIsReproducible: building every image again with nothing cached but the .debs (a
// fresh bin/ and layers/: binaries relinked, layers written and compressed anew) gives the same
// digests as the tool cache's build, so a digest depends only on the sources, the packages and
// Envoy, and no cached layer is stale.
func TestBuildIsReproducible(t *testing.T) {
	first := builtImages(t)
	opts := testOptions(t)
	fresh := t.TempDir()
	if err := os.Symlink(filepath.Join(opts.CacheDir, "debs"), filepath.Join(fresh, "debs")); err != nil {
		t.Fatal(err)
	}
	opts.CacheDir = fresh
	again, err := Build(context.Background(), opts, Images())
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != len(Images()) {
		t.Fatalf("built %d images, want %d", len(again), len(Images()))
	}
	for _, b := range again {
		d1, err := first[b.Ref].Digest()
		if err != nil {
			t.Fatal(err)
		}
		d2, err := b.Image.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if d1 != d2 {
			t.Errorf("%s: digest %s from the cache, %s built afresh", b.Ref, d1, d2)
		}
	}
}

// TestImageContents: each image holds its Copies where the definition says (executable), /tmp
// (1777), and, for the Debian images, the merged-/usr layout, no manual pages, copyright files
// and a CA bundle of every certificate ca-certificates ships. The images' configs are
// linux/amd64 with the definition's entrypoint and user.
func TestImageContents(t *testing.T) {
	imgs := builtImages(t)
	for _, def := range Images() {
		t.Run(def.Ref, func(t *testing.T) {
			img := imgs[def.Ref]
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.OS != "linux" || cf.Architecture != "amd64" || strings.Join(cf.Config.Entrypoint, " ") != strings.Join(def.Config.Entrypoint, " ") ||
				cf.Config.User != def.Config.User || !cf.Created.Time.Equal(epoch) {
				t.Errorf("config %s/%s entrypoint %q user %q created %v; want linux/amd64, %q, %q, %v", cf.OS, cf.Architecture,
					cf.Config.Entrypoint, cf.Config.User, cf.Created, def.Config.Entrypoint, def.Config.User, epoch)
			}
			hdrs, data := imageFiles(t, img, "etc/ssl/certs/ca-certificates.crt")
			for _, c := range def.Copies {
				h := hdrs[strings.TrimPrefix(c.Dst, "/")]
				if h == nil || h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 || h.Size == 0 {
					t.Errorf("%s: %+v, want a non-empty executable file", c.Dst, h)
				}
			}
			if h := hdrs["tmp"]; h == nil || h.Typeflag != tar.TypeDir || h.Mode&0o7777 != 0o1777 {
				t.Errorf("/tmp: %+v, want a directory with mode 1777", h)
			}
			if len(def.Packages) == 0 {
				if len(hdrs) > len(def.Copies)+8 {
					t.Errorf("%d members, want little more than the %d files copied", len(hdrs), len(def.Copies))
				}
				return
			}
			// Merged /usr: each of /bin, /lib, /lib64 whose /usr directory has content (libc6
			// alone, the SPIRE server's closure, has no /usr/bin) is a link into /usr.
			links := 0
			for _, d := range []string{"bin", "lib", "lib64"} {
				if hdrs["usr/"+d] == nil {
					continue
				}
				if h := hdrs[d]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/"+d {
					t.Errorf("/%s: %+v, want a link to usr/%s (merged /usr)", d, h, d)
				}
				links++
			}
			if links == 0 || hdrs["lib64"] == nil {
				t.Errorf("no merged-/usr links, or no /lib64 (the loader's directory): %d links", links)
			}
			var crts, copyrights int
			for name, h := range hdrs {
				if strings.HasPrefix(name, "usr/share/man/") || strings.HasPrefix(name, "usr/share/locale/") {
					t.Errorf("/%s: documentation and translations are left out", name)
				}
				if strings.HasPrefix(name, "usr/share/ca-certificates/") && strings.HasSuffix(name, ".crt") {
					crts++
				}
				if strings.HasPrefix(name, "usr/share/doc/") && strings.HasSuffix(name, "/copyright") && h.Typeflag == tar.TypeReg {
					copyrights++
				}
			}
			if copyrights == 0 {
				t.Errorf("no /usr/share/doc/*/copyright: the packages' licences are kept")
			}
			if crts == 0 {
				return
			}
			var n int
			rest := data["etc/ssl/certs/ca-certificates.crt"]
			for {
				var b *pem.Block
				if b, rest = pem.Decode(rest); b == nil {
					break
				}
				if _, err := x509.ParseCertificate(b.Bytes); err != nil {
					t.Errorf("CA bundle: certificate %d: %v", n, err)
				}
				n++
			}
			if n != crts || crts < 100 {
				t.Errorf("CA bundle holds %d certificates; ca-certificates ships %d (want all, over 100)", n, crts)
			}
		})
	}
}

// TestWriteTarballs: the tarballs hold each image under its reference, with its config and
// layers (read back with go-containerregistry's tarball reader, as ctr images import reads
// the docker save format).
func TestWriteTarballs(t *testing.T) {
	imgs := builtImages(t)
	bs := []Built{{Ref: PauseImage, Image: imgs[PauseImage]}, {Ref: WorkloadsImage, Image: imgs[WorkloadsImage]}}
	files, err := WriteTarballs(t.TempDir(), bs)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range files {
		want := "aether-pause.tar"
		if i == 1 {
			want = "aether-e2e-workloads.tar"
		}
		if filepath.Base(f) != want {
			t.Errorf("tarball %s, want %s", f, want)
		}
		tag, err := name.NewTag(bs[i].Ref)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tarball.ImageFromPath(f, &tag)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		c1, _ := got.ConfigName()
		c2, _ := bs[i].Image.ConfigName()
		l1, _ := got.Layers()
		l2, _ := bs[i].Image.Layers()
		if c1 != c2 || len(l1) != len(l2) {
			t.Errorf("%s: config %s with %d layers, want %s with %d", f, c1, len(l1), c2, len(l2))
		}
		for j := range l1 {
			d1, _ := l1[j].Digest()
			d2, _ := l2[j].Digest()
			if d1 != d2 {
				t.Errorf("%s: layer %d is %s, want %s", f, j, d1, d2)
			}
		}
	}
}
