package embedded

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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

// The embedded etcd serves TLS when its client URL is https: a client that trusts the serving
// certificate's CA reads and writes, one that does not is refused; with a client CA, a client
// without a certificate signed by it is refused. Bad combinations are refused naming the field.
func TestStartServesTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := testenv.NewCA("aether-test-embedded-ca")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string { return testenv.WriteFile(t, dir, name, b) }
	caFile := write("ca.crt", ca.CertPEM)
	sc, sk, err := ca.Issue("aether-registry", nil, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	cc, ck, err := ca.Issue("aether.local.one", nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := write("server.crt", sc), write("server.key", sk)
	clientCert, clientKey := write("client.crt", cc), write("client.key", ck)
	other, err := testenv.NewCA("another-ca")
	if err != nil {
		t.Fatal(err)
	}
	otherCA := write("other.crt", other.CertPEM)

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	e, err := Start(ctx, Config{DataDir: filepath.Join(dir, "registry"),
		ClientURL: fmt.Sprintf("https://127.0.0.1:%d", testenv.FreePort(t)), PeerURL: fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)),
		CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile, LogFile: filepath.Join(dir, "etcd.log"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	put := func(cert, key, ca string) error {
		tlsCfg, err := registry.TLSFiles(cert, key, ca)
		if err != nil {
			return err
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, TLS: tlsCfg, DialTimeout: 3 * time.Second})
		if err != nil {
			return err
		}
		defer cli.Close()
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err = cli.Put(pctx, registry.Root+"tls-check", "x")
		return err
	}
	if err := put(clientCert, clientKey, caFile); err != nil {
		t.Fatalf("a client with the CA and a client certificate: %v", err)
	}
	if err := put(clientCert, clientKey, otherCA); err == nil {
		t.Fatal("a client that does not trust the serving certificate's CA was served")
	}
	if err := put("", "", caFile); err == nil {
		t.Fatal("a client without a client certificate was served with a client CA set")
	}
	if err := put("", "", ""); err == nil {
		t.Fatal("a plaintext client was served on the https URL")
	}

	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"https without a certificate", Config{DataDir: dir, ClientURL: "https://127.0.0.1:1"}, "https needs CertFile and KeyFile"},
		{"certificate on http", Config{DataDir: dir, ClientURL: "http://127.0.0.1:1", CertFile: certFile, KeyFile: keyFile}, "needs an https:// URL"},
		{"other scheme", Config{DataDir: dir, ClientURL: "unix:///tmp/x"}, "want http:// or https://"},
	} {
		if _, err := Start(ctx, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}
