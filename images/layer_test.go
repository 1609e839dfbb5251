package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBuildImage: BuildImage gives the same digest for the same inputs (whatever the files'
// times), a tar sorted by name with parents first, epoch times, root owners, the modes asked
// for, and errors naming a bad destination or a missing file.
func TestBuildImage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "prog")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	layer := Layer{
		Files: []File{{Src: bin, Dst: "/usr/local/bin/prog", Mode: 0o755}, {Src: bin, Dst: "/etc/prog.conf"}},
		Links: []Link{{Dst: "/bin", Target: "usr/bin"}},
		Dirs:  []Dir{{Path: "/tmp", Mode: 0o777 | os.ModeSticky}},
	}
	cfg := Config{Entrypoint: []string{"/usr/local/bin/prog"}, User: "65532:65532"}
	img1, err := BuildImage([]Layer{layer}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(bin, later, later); err != nil {
		t.Fatal(err)
	}
	img2, err := BuildImage([]Layer{layer}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img1.Digest()
	d2, _ := img2.Digest()
	if d1 != d2 {
		t.Errorf("digests %s and %s for the same inputs", d1, d2)
	}
	ls, _ := img1.Layers()
	rc, err := ls[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var got []string
	eachMember(t, rc, func(h *tar.Header, _ io.Reader) {
		if !h.ModTime.Equal(epoch) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: time %v owner %d:%d, want the epoch and root", h.Name, h.ModTime, h.Uid, h.Gid)
		}
		got = append(got, fmt.Sprintf("%s %c %04o", h.Name, h.Typeflag, h.Mode))
	})
	want := []string{"bin 2 0777", "etc/ 5 0755", "etc/prog.conf 0 0700", "tmp/ 5 1777", "usr/ 5 0755", "usr/local/ 5 0755",
		"usr/local/bin/ 5 0755", "usr/local/bin/prog 0 0755"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("layer members:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	for name, c := range map[string]struct {
		l    Layer
		want string
	}{
		"relative destination": {Layer{Files: []File{{Src: bin, Dst: "usr/bin/x"}}}, `destination "usr/bin/x"`},
		"missing source":       {Layer{Files: []File{{Src: filepath.Join(dir, "nope"), Dst: "/x"}}}, "nope"},
		"twice":                {Layer{Files: []File{{Src: bin, Dst: "/x"}}, Links: []Link{{Dst: "/x", Target: "y"}}}, `"/x" is in the layer twice`},
	} {
		if _, err := BuildImage([]Layer{c.l}, Config{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %s", name, err, c.want)
		}
	}
}

// TestLayerCache: a layer is compressed once and found again by its content (same digest,
// same tar back); the cache files are readable by all; prune deletes what no build used for
// layerCacheAge and keeps what a build just used.
func TestLayerCache(t *testing.T) {
	c := layerCache{dir: t.TempDir()}
	calls := 0
	write := func(w io.Writer) error {
		calls++
		return writeLayer(w, []entry{{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "a", Mode: 0o644, Size: 5}, data: []byte("hello")}})
	}
	l1, err := c.layer(write)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Errorf("write called %d times for a new layer, want 2 (hash, compress)", calls)
	}
	l2, err := c.layer(write)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 3 {
		t.Errorf("write called %d times in all, want 3 (a cached layer is only hashed)", calls)
	}
	d1, _ := l1.Digest()
	d2, _ := l2.Digest()
	id1, _ := l1.DiffID()
	if d1 != d2 || d1 == id1 {
		t.Errorf("digests %s, %s (diff ID %s): want equal, and not the diff ID (compressed)", d1, d2, id1)
	}
	var want bytes.Buffer
	_ = write(&want)
	rc, err := l2.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("cached layer's tar differs from what was written")
	}
	if n, _ := unpackedSize(l2); n != int64(want.Len()) {
		t.Errorf("unpacked size %d, want %d", n, want.Len())
	}

	age := func() {
		des, _ := os.ReadDir(c.dir)
		old := time.Now().Add(-layerCacheAge - time.Hour)
		for _, de := range des {
			if err := os.Chtimes(filepath.Join(c.dir, de.Name()), old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	files := func() int {
		des, _ := os.ReadDir(c.dir)
		for _, de := range des {
			if info, _ := de.Info(); info.Mode().Perm() != 0o644 {
				t.Errorf("%s: mode %v, want 0644", de.Name(), info.Mode().Perm())
			}
		}
		return len(des)
	}
	if n := files(); n != 2 {
		t.Fatalf("%d cache files, want a blob and its record", n)
	}
	age()
	if _, err := c.layer(write); err != nil {
		t.Fatal(err)
	}
	if err := c.prune(); err != nil {
		t.Fatal(err)
	}
	if n := files(); n != 2 {
		t.Errorf("prune removed a layer a build just used: %d files left", n)
	}
	age()
	if err := c.prune(); err != nil {
		t.Fatal(err)
	}
	if n := files(); n != 0 {
		t.Errorf("prune left %d files no build used for %v", n, layerCacheAge)
	}
}
