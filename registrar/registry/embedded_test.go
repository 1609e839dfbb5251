package registry

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/aethermesh/aether/internal/testenv"
)

// The embedded etcd (the registrar's single-machine default) serves the registry and keeps it
// across restarts in its data directory.
func TestStartEmbeddedKeepsDataAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	cfg := EmbeddedConfig{
		DataDir:   filepath.Join(dir, "registry"),
		ClientURL: fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)),
		PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)),
		LogFile:   filepath.Join(dir, "etcd.log"),
		Logger:    testLogger(t),
	}
	ctx := ctxT(t, converge)
	// No endpoints: Open starts the embedded etcd.
	r, closeAll, err := Open(ctx, Config{Region: "local", Cluster: "one", Logger: testLogger(t)}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Export(ctx, testExport()); err != nil {
		t.Fatal(err)
	}
	closeAll()

	e, err := StartEmbedded(ctx, cfg)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	defer e.Close()
	r = newTestRegistry(t, e.Endpoints, "local", "one", nil)
	exps, _, err := r.ListExports(ctx)
	if err != nil || len(exps) != 1 || exps[0].Origin != (Origin{"local", "one"}) {
		t.Fatalf("after restart: %v, %v", exps, err)
	}
	if _, err := StartEmbedded(ctx, EmbeddedConfig{}); err == nil {
		t.Fatal("StartEmbedded without a data directory succeeded")
	}
}
