package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
)

// runSetupAuth runs `aether-registrar setup-registry-auth args...` as a child process with env
// added, and returns its output and exit code.
func runSetupAuth(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	return runSubcommand(t, registrar.SetupAuthCommand, env, args...)
}

// runSubcommand runs `aether-registrar <sub> args...` (this test binary as the registrar) with
// env added, and returns its combined output and exit code.
func runSubcommand(t *testing.T, sub string, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{sub}, args...)...)
	cmd.Env = append(append(os.Environ(), "AETHER_REGISTRAR_MAIN=1"), env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	}
	t.Fatalf("run %s: %v", sub, err)
	return "", 0
}

// TestSetupRegistryAuthCommand: the subcommand turns on etcd authentication with a user and role
// per cluster, against a real etcd: a cluster's credentials write its own prefix and nothing
// else, anonymous writes fail; a second run (as root, auth on) adds a cluster and changes
// nothing else; bad input exits 2 naming the flag or variable and leaves etcd as it was.
func TestSetupRegistryAuthCommand(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, func(c *embed.Config) { c.BcryptCost = 4 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	endpoints := strings.Join(etcd.Endpoints, ",")
	env := []string{"AETHER_REGISTRY_ROOT_PASSWORD=pw-root", "AETHER_REGISTRY_PASSWORD_EU_EAST=pw-east", "AETHER_REGISTRY_ENDPOINTS=" + endpoints}

	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no root password", []string{"AETHER_REGISTRY_ENDPOINTS=" + endpoints}, []string{"--clusters", "eu/east"}, "AETHER_REGISTRY_ROOT_PASSWORD is required"},
		{"origin without a region", env, []string{"--clusters", "east"}, `--clusters "east": want <region>/<cluster>`},
		{"bad cluster name", env, []string{"--clusters", "eu/East_1"}, `--clusters "eu/East_1"`},
		{"no clusters", env, nil, "--clusters is required"},
	} {
		out, code := runSetupAuth(t, c.env, c.args...)
		if code != 2 || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d, output %q; want exit 2 and %q", c.name, code, out, c.want)
		}
	}
	anon, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.Put(ctx, "/probe", "x"); err != nil {
		t.Fatalf("etcd changed by refused runs: anonymous put: %v", err)
	}

	out, code := runSetupAuth(t, env, "--clusters", "eu/east,eu/west")
	if code != 0 || !strings.Contains(out, "user aether.eu.east") || !strings.Contains(out, "password from AETHER_REGISTRY_PASSWORD_EU_EAST") ||
		!strings.Contains(out, "user aether.eu.west") || !strings.Contains(out, "TLS client certificate (CN aether.eu.west)") {
		t.Fatalf("setup: exit %d, output:\n%s", code, out)
	}
	east, err := registry.New(registry.Config{Endpoints: etcd.Endpoints, Region: "eu", Cluster: "east", Username: "aether.eu.east", Password: "pw-east"})
	if err != nil {
		t.Fatal(err)
	}
	defer east.Close()
	if _, err := east.Client().Put(ctx, registry.Origin{Region: "eu", Cluster: "east"}.ExportKey("shop", "web"), "x"); err != nil {
		t.Errorf("east writes its own prefix: %v", err)
	}
	if _, err := east.Client().Put(ctx, registry.Origin{Region: "eu", Cluster: "west"}.ExportKey("shop", "web"), "x"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("east writes west's prefix: %v, want permission denied", err)
	}
	if _, err := anon.Put(ctx, "/probe", "y"); err == nil {
		t.Error("anonymous put succeeded with auth on")
	}

	// Again, with auth on: adds north, keeps east's password.
	if out, code := runSetupAuth(t, env, "--clusters", "eu/east,eu/north"); code != 0 {
		t.Fatalf("second setup: exit %d, output:\n%s", code, out)
	}
	root, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints, Username: "root", Password: "pw-root"})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	users, err := root.UserList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(users.Users, ","); got != "aether.eu.east,aether.eu.north,aether.eu.west,root" {
		t.Errorf("etcd users %s, want aether.eu.east,aether.eu.north,aether.eu.west,root", got)
	}
	if _, err := east.Client().Put(ctx, registry.Origin{Region: "eu", Cluster: "east"}.ExportKey("shop", "web"), "z"); err != nil {
		t.Errorf("east writes its own prefix after the second run: %v", err)
	}
}
