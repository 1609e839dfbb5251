package registry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/aethermesh/aether/internal/testenv"
)

// With etcd auth on (SetupAuth), each cluster's user reads the whole root and writes only its
// own prefix: a write outside it is denied by etcd itself, with the cluster's own credentials
// and no registry client in between.
func TestAuthPerClusterUsers(t *testing.T) {
	// The lowest bcrypt cost (4) keeps password checks cheap under the race detector.
	etcd := testenv.StartEmbeddedEtcd(t, func(c *embed.Config) { c.BcryptCost = 4 })
	ctx := ctxT(t, converge)
	admin, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	alpha, beta := Origin{"eu", "alpha"}, Origin{"eu", "beta"}
	users := []ClusterUser{{Origin: alpha, Password: "pw-alpha"}, {Origin: beta, Password: "pw-beta"}}
	if err := SetupAuth(ctx, admin, "pw-root", users); err != nil {
		t.Fatal(err)
	}
	// Idempotent, as root once auth is on.
	root, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints, Username: "root", Password: "pw-root"})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := SetupAuth(ctx, root, "pw-root", users); err != nil {
		t.Fatalf("second SetupAuth: %v", err)
	}
	role, err := root.RoleGet(ctx, UserName(alpha))
	if err != nil || len(role.Perm) != 2 {
		t.Fatalf("role %s: %v permissions, %v; want exactly 2", UserName(alpha), role, err)
	}

	a := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", func(c *Config) { c.Username, c.Password = UserName(alpha), "pw-alpha" })
	b := newTestRegistry(t, etcd.Endpoints, "eu", "beta", func(c *Config) { c.Username, c.Password = UserName(beta), "pw-beta" })
	v := startViewer(t, a.WatchEndpoints(ctx))
	for _, r := range []*Registry{a, b} {
		if err := r.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "p1", "10.0.0.1")); err != nil {
			t.Fatalf("%s registers in its own prefix: %v", r.Origin(), err)
		}
		if err := r.Export(ctx, testExport()); err != nil {
			t.Fatalf("%s exports: %v", r.Origin(), err)
		}
		if err := r.PutConfig(ctx, testConfig()); err != nil {
			t.Fatalf("%s puts config: %v", r.Origin(), err)
		}
	}
	v.waitKeys(t, alpha.EndpointKey("shop", "cart", "p1"), beta.EndpointKey("shop", "cart", "p1"))

	// alpha's credentials straight against etcd, outside alpha's prefix.
	cli := a.Client()
	for name, op := range map[string]func() error{
		"put into beta": func() error {
			_, err := cli.Put(ctx, beta.EndpointKey("shop", "cart", "forged"), "x")
			return err
		},
		"overwrite beta": func() error {
			_, err := cli.Put(ctx, beta.ExportKey("shop", "cart"), "x")
			return err
		},
		"delete beta": func() error {
			_, err := cli.Delete(ctx, beta.ConfigKey("shop", "cart"))
			return err
		},
		"txn into beta": func() error {
			_, err := cli.Txn(ctx).Then(clientv3.OpPut(alpha.ExportKey("shop", "x"), "x"), clientv3.OpPut(beta.ExportKey("shop", "x"), "x")).Commit()
			return err
		},
		"put outside the root": func() error {
			_, err := cli.Put(ctx, "/aether/v1/other", "x")
			return err
		},
	} {
		if err := op(); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s with alpha's credentials: error = %v, want permission denied", name, err)
		}
	}
	// Nothing of beta's changed; alpha still reads everything.
	exps, _, err := a.ListExports(ctx)
	if err != nil || len(exps) != 2 {
		t.Fatalf("alpha lists %d exports, %v; want 2", len(exps), err)
	}
	// Without credentials nothing can be written.
	anon, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.Put(ctx, alpha.ExportKey("shop", "anon"), "x"); err == nil {
		t.Fatal("anonymous put succeeded with auth on")
	}
	// The lease owner may revoke its own lease (write permission on every attached key).
	if err := a.RevokeEndpoints(ctx); err != nil {
		t.Fatalf("alpha revokes its lease: %v", err)
	}
	v.waitKeys(t, beta.EndpointKey("shop", "cart", "p1"))
}

// TLS client certificates: the registry connects to an https etcd that requires client
// certificates; with auth on, etcd takes the user from the certificate's CN (no password), and
// the per-cluster role still confines writes.
func TestTLSClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca, err := testenv.NewCA("aether-test-etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string { return testenv.WriteFile(t, dir, name, b) }
	caFile := write("ca.pem", ca.CertPEM)
	issue := func(cn string) (string, string) {
		c, k, err := ca.Issue(cn, nil, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
		if err != nil {
			t.Fatal(err)
		}
		return write(cn+".pem", c), write(cn+"-key.pem", k)
	}
	serverCert, serverKey := issue("etcd-server")
	rootCert, rootKey := issue("root")
	alphaCert, alphaKey := issue("aether.eu.alpha")
	clientURL := fmt.Sprintf("https://127.0.0.1:%d", testenv.FreePort(t))
	etcd := testenv.StartEmbeddedEtcd(t, func(c *embed.Config) {
		u, _ := url.Parse(clientURL)
		c.ListenClientUrls, c.AdvertiseClientUrls = []url.URL{*u}, []url.URL{*u}
		c.ClientTLSInfo = transport.TLSInfo{CertFile: serverCert, KeyFile: serverKey, TrustedCAFile: caFile, ClientCertAuth: true}
	})
	ctx := ctxT(t, converge)

	rootTLS, err := TLSFiles(rootCert, rootKey, caFile)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints, TLS: rootTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	alpha, beta := Origin{"eu", "alpha"}, Origin{"eu", "beta"}
	if err := SetupAuth(ctx, admin, "pw-root", []ClusterUser{{Origin: alpha}, {Origin: beta}}); err != nil {
		t.Fatal(err)
	}

	alphaTLS, err := TLSFiles(alphaCert, alphaKey, caFile)
	if err != nil {
		t.Fatal(err)
	}
	a := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", func(c *Config) { c.TLS = alphaTLS })
	if err := a.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "p1", "10.0.0.1")); err != nil {
		t.Fatalf("register over TLS as %s: %v", UserName(alpha), err)
	}
	recs, _, err := a.ListEndpoints(ctx)
	if err != nil || len(recs) != 1 {
		t.Fatalf("list over TLS: %d records, %v", len(recs), err)
	}
	if _, err := a.Client().Put(ctx, beta.ExportKey("shop", "cart"), "x"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("put into beta with alpha's certificate: %v, want permission denied", err)
	}

	// beta's certificate for alpha's partition: its CN is the user, not alpha's.
	betaCert, betaKey := issue("aether.eu.beta")
	betaTLS, err := TLSFiles(betaCert, betaKey, caFile)
	if err != nil {
		t.Fatal(err)
	}
	wrong := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", func(c *Config) { c.TLS = betaTLS; c.ClusterID = "cid-eu-alpha" })
	var ue *UserError
	if err := wrong.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "p9", "10.0.0.9")); !errors.As(err, &ue) || ue.User != UserName(beta) {
		t.Fatalf("alpha's partition with beta's certificate: %v, want a UserError for user %s", err, UserName(beta))
	}

	// Without a client certificate the TLS handshake is refused.
	noCert, err := TLSFiles("", "", caFile)
	if err != nil {
		t.Fatal(err)
	}
	anon, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints, TLS: noCert})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := anon.Get(actx, Root); err == nil {
		t.Fatal("a client without a certificate could read")
	}
}

// With etcd authentication on, a writer writes only as its cluster's own user: with another
// cluster's credentials, root's, or none, its first write fails with a UserError naming both
// users, ClaimStatus reports it and nothing reaches etcd; AllowForeignUser lets root write (the
// --registry-insecure escape); the cluster's own user writes. A client certificate's CN counts
// as the user (TestTLSClientCertificates covers that path's writes).
func TestAuthRefusesForeignUser(t *testing.T) {
	alpha, beta := Origin{"eu", "alpha"}, Origin{"eu", "beta"}
	etcd := startAuthEtcd(t, ClusterUser{Origin: alpha, Password: "pw-alpha"}, ClusterUser{Origin: beta, Password: "pw-beta"})
	ctx := ctxT(t, converge)
	root, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints, Username: "root", Password: "pw-root"})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	key := alpha.EndpointKey("shop", "cart", "p1")
	for _, c := range []struct {
		name, user, password string
	}{{"beta's user", UserName(beta), "pw-beta"}, {"root", "root", "pw-root"}} {
		r := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", func(cfg *Config) { cfg.Username, cfg.Password = c.user, c.password })
		err := r.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "p1", "10.0.0.1"))
		var ue *UserError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), `"`+c.user+`"`) || !strings.Contains(err.Error(), `"`+UserName(alpha)+`"`) {
			t.Fatalf("%s writes alpha's partition: %v, want a UserError naming %q and %q", c.name, err, c.user, UserName(alpha))
		}
		if _, err := r.ClaimStatus(); !errors.As(err, &ue) {
			t.Fatalf("%s: ClaimStatus %v, want the UserError", c.name, err)
		}
		if resp, err := root.Get(ctx, alpha.Prefix(), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
			t.Fatalf("%s: alpha's partition holds %d keys (%v), want none", c.name, resp.Count, err)
		}
	}
	noUser := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", nil)
	if _, err := noUser.EnsureClaim(ctx); err == nil || !strings.Contains(err.Error(), "no etcd user") {
		t.Fatalf("a writer without credentials: %v, want a UserError saying it has no etcd user", err)
	}

	allowed := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", func(cfg *Config) {
		cfg.Username, cfg.Password, cfg.AllowForeignUser = "root", "pw-root", true
	})
	if err := allowed.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "p1", "10.0.0.1")); err != nil {
		t.Fatalf("root with AllowForeignUser: %v", err)
	}
	own := newTestRegistry(t, etcd.Endpoints, "eu", "alpha", func(cfg *Config) { cfg.Username, cfg.Password = UserName(alpha), "pw-alpha" })
	if err := own.RegisterEndpoint(ctx, testEndpoint("shop", "cart", "p2", "10.0.0.2")); err != nil {
		t.Fatalf("alpha's own user: %v", err)
	}
	if resp, err := root.Get(ctx, key); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the allowed write is not in etcd: %v %v", resp, err)
	}
}
