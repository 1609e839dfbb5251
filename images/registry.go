package images

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// LocalReference returns where ref is stored in the local registry at host (HOST:PORT, plain
// HTTP): the same repository and tag (or digest), on host. The repository is ref's after the
// normalization containerd and go-containerregistry share: a reference without a registry is
// Docker Hub's, and a one-part Docker Hub name is under library/. So "aether-agent:dev" (=
// docker.io/library/aether-agent:dev) is host/library/aether-agent:dev, and
// "registry.k8s.io/pause:3.10" is host/pause:3.10. The registry part of ref is dropped: a
// containerd whose hosts.toml makes host the mirror of ref's registry asks host for
// /v2/<repository>/manifests/<tag> (with ?ns=<registry>, which the local registry ignores), so
// two references that differ only in their registry share one repository here.
func LocalReference(ref, host string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("local reference of %q: %w", ref, err)
	}
	s := host + "/" + r.Context().RepositoryStr()
	switch r := r.(type) {
	case name.Tag:
		s += ":" + r.TagStr()
	case name.Digest:
		s += "@" + r.DigestStr()
	}
	local, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		return nil, fmt.Errorf("local reference of %q on %q: %w", ref, host, err)
	}
	return local, nil
}

// transport is Push's HTTP transport: the default one without proxies, since the registry is
// on this machine or its substrate's underlay.
func transport() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	return t
}

// Push writes imgs to the registry at host (HOST:PORT, plain HTTP), each under
// LocalReference(Ref, host), blobs shared between images sent once. Errors name the image.
func Push(ctx context.Context, host string, imgs []Built) error {
	m := make(map[name.Reference]remote.Taggable, len(imgs))
	for _, b := range imgs {
		ref, err := LocalReference(b.Ref, host)
		if err != nil {
			return fmt.Errorf("push: %w", err)
		}
		m[ref] = b.Image
	}
	if err := remote.MultiWrite(m, remote.WithContext(ctx), remote.WithTransport(transport())); err != nil {
		return fmt.Errorf("push to %s: %w", host, err)
	}
	return nil
}

// Registry is a local OCI distribution registry (go-containerregistry's pkg/registry) served
// over plain HTTP: what the substrate's containerd pulls from. Manifests are kept in memory,
// blobs in memory or in a directory.
type Registry struct {
	srv   *http.Server
	addr  net.Addr
	done  chan error
	once  sync.Once
	close error
}

// ServeRegistry serves a registry on l until Close: blobs under blobDir ("" keeps them in
// memory), requests logged to log at debug level (nil: not logged). The listener's address is
// the host Push and LocalReference take (Addr); a node reaches it on whatever address of l it
// can route to.
func ServeRegistry(l net.Listener, blobDir string, log *slog.Logger) *Registry {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts := []registry.Option{registry.Logger(slog.NewLogLogger(log.Handler(), slog.LevelDebug))}
	if blobDir != "" {
		opts = append(opts, registry.WithBlobHandler(registry.NewDiskBlobHandler(blobDir)))
	}
	r := &Registry{
		srv:  &http.Server{Handler: registry.New(opts...), ReadHeaderTimeout: 30 * time.Second},
		addr: l.Addr(),
		done: make(chan error, 1),
	}
	go func() { r.done <- r.srv.Serve(l) }()
	return r
}

// Addr is the registry's HOST:PORT (the listener's address).
func (r *Registry) Addr() string { return r.addr.String() }

// Close stops the registry (open connections closed) and returns the server's error, if it
// failed other than by being closed. Later calls return the same.
func (r *Registry) Close() error {
	r.once.Do(func() {
		r.close = r.srv.Close()
		if err := <-r.done; !errors.Is(err, http.ErrServerClosed) {
			r.close = err
		}
	})
	return r.close
}
