package registrar

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/aethermesh/aether/internal/envflag"
	"github.com/aethermesh/aether/internal/registryflag"
	"github.com/aethermesh/aether/registry"
)

// SetupAuthCommand is the subcommand that makes origins unforgeable on a shared etcd.
const SetupAuthCommand = "setup-registry-auth"

// AuthConfig is the configuration of `aether-registrar setup-registry-auth`.
type AuthConfig struct {
	Registry     registryflag.Flags     // --registry-endpoints, --registry-ca, --registry-cert, --registry-key
	RootPassword string                 // AETHER_REGISTRY_ROOT_PASSWORD only (never a flag: it would show in ps)
	Users        []registry.ClusterUser // --clusters, passwords from clusterPasswordVar
	Timeout      time.Duration          // --timeout
}

// ClusterPasswordVar is the environment variable holding a cluster user's password:
// AETHER_REGISTRY_PASSWORD_<REGION>_<CLUSTER>, upper case, '-' as '_'. Unset means no password
// (the cluster authenticates with a TLS client certificate whose CN is the user name).
func ClusterPasswordVar(o registry.Origin) string {
	return "AETHER_REGISTRY_PASSWORD_" + strings.ToUpper(strings.ReplaceAll(o.Region+"_"+o.Cluster, "-", "_"))
}

// ParseAuthConfig reads the subcommand's flags (args after its name) with environment defaults
// from getenv. Each error names the flag or variable and its value.
func ParseAuthConfig(args []string, getenv func(string) string) (AuthConfig, error) {
	var c AuthConfig
	fs := flag.NewFlagSet("aether-registrar "+SetupAuthCommand, flag.ContinueOnError)
	ef := &envflag.Set{FS: fs, Getenv: getenv}
	c.Registry.Define(ef, registryflag.Usage{Cert: "client certificate for the registry (with --client-cert-auth, CN root)"})
	clusters := fs.String("clusters", "", "comma-separated <region>/<cluster> origins to create a user and role for; a user's password comes from AETHER_REGISTRY_PASSWORD_<REGION>_<CLUSTER> (upper case, - as _), none when unset (TLS client certificate with CN aether.<region>.<cluster>)")
	fs.DurationVar(&c.Timeout, "timeout", 30*time.Second, "how long the whole setup may take")
	if err := ef.Parse(args); err != nil {
		return c, err
	}
	var errs []error
	if len(c.Registry.Endpoints()) == 0 {
		errs = append(errs, errors.New("--registry-endpoints is required"))
	}
	c.RootPassword = getenv("AETHER_REGISTRY_ROOT_PASSWORD")
	if c.RootPassword == "" {
		errs = append(errs, errors.New("AETHER_REGISTRY_ROOT_PASSWORD is required (the etcd root user's password)"))
	}
	for _, s := range envflag.List(*clusters) {
		region, cluster, ok := strings.Cut(s, "/")
		o := registry.Origin{Region: region, Cluster: cluster}
		if !ok {
			errs = append(errs, fmt.Errorf("--clusters %q: want <region>/<cluster>", s))
			continue
		}
		if err := o.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("--clusters %q: %w", s, err))
			continue
		}
		c.Users = append(c.Users, registry.ClusterUser{Origin: o, Password: getenv(ClusterPasswordVar(o))})
	}
	if len(c.Users) == 0 && *clusters == "" {
		errs = append(errs, errors.New("--clusters is required"))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %s: want a positive duration", c.Timeout))
	}
	errs = append(errs, c.Registry.CheckTLS()...)
	return c, errors.Join(errs...)
}

// SetupAuth runs registry.SetupAuth as the etcd root user (which also works before auth is on:
// etcd then ignores the credentials), so it can be run again to add clusters. On success it
// prints each cluster user, what it may write and how it authenticates, to out. It returns the
// error of the connection or of etcd.
func SetupAuth(ctx context.Context, c AuthConfig, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	tlsCfg, err := c.Registry.TLS()
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Registry.Endpoints(), TLS: tlsCfg, Username: "root", Password: c.RootPassword,
		DialTimeout: 5 * time.Second, Context: ctx,
		// clientv3's own zap log is dropped: on a first run it logs a retry of every call made
		// before auth is enabled, on a rerun "already exists" for every user and role, both
		// expected; the errors that matter are returned.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return fmt.Errorf("connect to the registry's etcd %v: %w", c.Registry.Endpoints(), err)
	}
	defer cli.Close()
	if err := registry.SetupAuth(ctx, cli, c.RootPassword, c.Users); err != nil {
		return err
	}
	for _, u := range c.Users {
		how := "TLS client certificate (CN " + registry.UserName(u.Origin) + ")"
		if u.Password != "" {
			how = "password from " + ClusterPasswordVar(u.Origin)
		}
		fmt.Fprintf(out, "user %s: read the registry, write %s; authenticates by %s\n", registry.UserName(u.Origin), u.Origin.Prefix(), how)
	}
	fmt.Fprintln(out, "etcd authentication is on")
	return nil
}
