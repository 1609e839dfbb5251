package images

import (
	"context"
	"net"
	"net/http"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func TestLocalReference(t *testing.T) {
	for _, c := range []struct{ ref, want string }{
		{"aether-agent:dev", "127.0.0.1:5000/library/aether-agent:dev"},
		{"docker.io/library/aether-agent:dev", "127.0.0.1:5000/library/aether-agent:dev"},
		{"index.docker.io/aether/agent:v1", "127.0.0.1:5000/aether/agent:v1"},
		{"registry.k8s.io/pause:3.10", "127.0.0.1:5000/pause:3.10"},
		{"ghcr.io/org/team/app", "127.0.0.1:5000/org/team/app:latest"},
		{"quay.io/x/y@sha256:0123456789012345678901234567890123456789012345678901234567890123",
			"127.0.0.1:5000/x/y@sha256:0123456789012345678901234567890123456789012345678901234567890123"},
	} {
		got, err := LocalReference(c.ref, "127.0.0.1:5000")
		if err != nil {
			t.Errorf("LocalReference(%q): %v", c.ref, err)
			continue
		}
		if got.Name() != c.want || got.Context().Registry.Scheme() != "http" {
			t.Errorf("LocalReference(%q) = %s (%s), want %s over http", c.ref, got.Name(), got.Context().Registry.Scheme(), c.want)
		}
	}
	if _, err := LocalReference("Aether:dev", "127.0.0.1:5000"); err == nil {
		t.Error("LocalReference(\"Aether:dev\"): no error for an upper-case repository")
	}
}

// TestPushAndPullThroughLocalRegistry: every built image pushed to a local registry on loopback
// (blobs on disk) comes back with the same digest from its local reference, the repositories
// are the ones containerd asks a mirror for (library/aether-agent, ...), and a manifest
// request as containerd makes it (the ?ns= of a mirror, an OCI Accept) answers with the digest.
func TestPushAndPullThroughLocalRegistry(t *testing.T) {
	imgs := builtImages(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := ServeRegistry(l, t.TempDir(), testLogger(t))
	t.Cleanup(func() {
		if err := reg.Close(); err != nil {
			t.Errorf("close registry: %v", err)
		}
	})
	var bs []Built
	for _, def := range Images() {
		bs = append(bs, Built{Ref: def.Ref, Image: imgs[def.Ref]})
	}
	ctx := context.Background()
	if err := Push(ctx, reg.Addr(), bs); err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		ref, err := LocalReference(b.Ref, reg.Addr())
		if err != nil {
			t.Fatal(err)
		}
		got, err := remote.Image(ref, remote.WithContext(ctx))
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		want, _ := b.Image.Digest()
		if d, err := got.Digest(); err != nil || d != want {
			t.Errorf("pull %s: digest %s (%v), pushed %s", ref, d, err, want)
		}
		ls, err := got.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			if _, err := unpackedSize(l); err != nil {
				t.Errorf("pull %s: layer: %v", ref, err)
			}
		}
	}
	host, err := name.NewRegistry(reg.Addr(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	repos, err := remote.Catalog(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"library/aether-agent", "library/aether-envoy", "library/aether-registrar", "library/aether-pause", "library/aether-e2e-workloads"} {
		if !slices.Contains(repos, want) {
			t.Errorf("catalog %v: no %s", repos, want)
		}
	}

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+reg.Addr()+"/v2/library/aether-agent/manifests/dev?ns=docker.io", nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want, _ := imgs[AgentImage].Digest()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Docker-Content-Digest") != want.String() {
		t.Errorf("GET /v2/library/aether-agent/manifests/dev?ns=docker.io: %s, digest %q; want 200 and %s", resp.Status, resp.Header.Get("Docker-Content-Digest"), want)
	}
}
