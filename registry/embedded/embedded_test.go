package embedded

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/registry"
)

// The embedded etcd (the registrar's single-machine default) serves the registry and keeps it
// across restarts in its data directory.
func TestStartKeepsDataAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := Config{
		DataDir:   filepath.Join(dir, "registry"),
		ClientURL: fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)),
		PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)),
		LogFile:   filepath.Join(dir, "etcd.log"),
		Logger:    log,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	export := &registryv1.ExportMark{
		Service:    &registryv1.ServiceRef{Namespace: "shop", Name: "cart"},
		Ports:      []*registryv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
		CreateTime: "2026-11-29T09:00:00.123456789Z",
	}
	open := func(e *Server) *registry.Registry {
		t.Helper()
		r, err := registry.New(registry.Config{Endpoints: e.Endpoints, Region: "local", Cluster: "one", Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	e, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := open(e)
	if err := r.Export(ctx, export); err != nil {
		t.Fatal(err)
	}
	_ = r.Close()
	e.Close()

	e, err = Start(ctx, cfg)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	defer e.Close()
	r = open(e)
	defer func() { _ = r.Close() }()
	exps, _, err := r.ListExports(ctx)
	if err != nil || len(exps) != 1 || exps[0].Origin != (registry.Origin{Region: "local", Cluster: "one"}) {
		t.Fatalf("after restart: %v, %v", exps, err)
	}
	if _, err := Start(ctx, Config{}); err == nil {
		t.Fatal("Start without a data directory succeeded")
	}
}
