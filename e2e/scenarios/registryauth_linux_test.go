package scenarios

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/e2e/mesh"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/registry"
)

// checkRegistryAuth checks the local mesh's registry as its clusters use it: TLS with client
// certificates, etcd authentication on (the mesh ran `aether-registrar setup-registry-auth`), each
// cluster its own user; a cluster's certificate cannot write another's partition, and a writer
// for one cluster with another cluster's certificate is refused with a UserError before it writes.
func checkRegistryAuth(t *testing.T, m *mesh.Mesh) {
	t.Helper()
	s := m.Substrate
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := func(cert, key string) *clientv3.Client {
		tlsCfg, err := registry.TLSFiles(cert, key, s.RegistryCAFile)
		if err != nil {
			t.Fatal(err)
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.RegistryEndpoint}, TLS: tlsCfg, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	a, b := s.Clusters[0], s.Clusters[1]
	root := client(s.RegistryRootCertFile, s.RegistryRootKeyFile)
	if st, err := root.AuthStatus(ctx); err != nil || !st.Enabled {
		t.Fatalf("registry auth status: %+v, %v; want authentication on", st, err)
	}
	alpha := client(a.RegistryCertFile, a.RegistryKeyFile)
	betaOrigin := registry.Origin{Region: registry.DefaultRegion, Cluster: b.Name}
	if _, err := alpha.Put(ctx, betaOrigin.ExportKey(ns, "forged"), "x"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("%s's certificate writes %s's partition: %v, want permission denied", a.Name, b.Name, err)
	}
	// It reads the whole registry: beta's partition claim, once beta's registrar made it.
	testenv.Eventually(t, time.Minute, a.Name+" reads "+b.Name+"'s partition claim", func() error {
		resp, err := alpha.Get(ctx, betaOrigin.ClaimKey())
		if err == nil && len(resp.Kvs) == 0 {
			err = errors.New("no claim yet")
		}
		return err
	})
	tlsCfg, err := registry.TLSFiles(b.RegistryCertFile, b.RegistryKeyFile, s.RegistryCAFile)
	if err != nil {
		t.Fatal(err)
	}
	wrong, err := registry.New(registry.Config{Endpoints: []string{s.RegistryEndpoint}, TLS: tlsCfg,
		Region: registry.DefaultRegion, Cluster: a.Name, ClusterID: "scenario-wrong-user"})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	var ue *registry.UserError
	if _, err := wrong.EnsureClaim(ctx); !errors.As(err, &ue) {
		t.Fatalf("a writer for %s with %s's certificate: %v, want a UserError", a.Name, b.Name, err)
	}
}
