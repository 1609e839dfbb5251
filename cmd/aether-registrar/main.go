// Command aether-registrar is aether's per-cluster, leader-elected controller set: MCS export
// (ServiceExport to a registry export mark) and import (ServiceImport and <svc>-clusterset VIP
// Service). With --registry-endpoints empty it embeds a single-member etcd (--registry-data-dir),
// the single-machine, single-replica deployment. It claims its cluster's registry partition for
// this cluster (the UID of its kube-system Namespace) and exits, writing nothing, when another
// cluster holds the claim (with an embedded registry it stays up instead, serving the registry,
// with its controllers stopped and readiness failing, until the claim is this cluster's again);
// `aether-registrar reclaim-partition` re-claims it after a rebuild. This command parses the
// flags of the registrar and of its two subcommands and calls package registrar (Run, SetupAuth,
// Reclaim). See docs/registrar.md for its flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == registrar.SetupAuthCommand {
		mainSetupAuth(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == registrar.ReclaimCommand {
		mainReclaim(os.Args[2:])
		return
	}
	cfg, err := registrar.ParseRunConfig(os.Args[1:], os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return // -h/--help: the flag set printed the usage
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "aether-registrar: invalid configuration:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := registrar.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "aether-registrar:", err)
		os.Exit(1)
	}
}

// mainSetupAuth runs `aether-registrar setup-registry-auth`: exit 0 when etcd auth is on with
// every user and role, 2 on bad input, 1 when etcd refused.
func mainSetupAuth(args []string) {
	c, err := registrar.ParseAuthConfig(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "aether-registrar %s: invalid configuration: %v\n", registrar.SetupAuthCommand, err)
		os.Exit(2)
	}
	if err := registrar.SetupAuth(context.Background(), c); err != nil {
		fmt.Fprintf(os.Stderr, "aether-registrar %s: %v\n", registrar.SetupAuthCommand, err)
		os.Exit(1)
	}
	for _, u := range c.Users {
		how := "TLS client certificate (CN " + registry.UserName(u.Origin) + ")"
		if u.Password != "" {
			how = "password from " + registrar.ClusterPasswordVar(u.Origin)
		}
		fmt.Printf("user %s: read the registry, write %s; authenticates by %s\n", registry.UserName(u.Origin), u.Origin.Prefix(), how)
	}
	fmt.Println("etcd authentication is on")
}

// mainReclaim runs `aether-registrar reclaim-partition`: exit 0 when this cluster holds its
// partition's claim (re-claimed or already), 2 on bad input (nothing is changed), 1 when the
// claim names another cluster ID than --previous-cluster-id or the API server or etcd failed.
func mainReclaim(args []string) {
	c, err := registrar.ParseReclaimConfig(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "aether-registrar %s: invalid configuration: %v\n", registrar.ReclaimCommand, err)
		os.Exit(2)
	}
	if err := registrar.Reclaim(context.Background(), c, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "aether-registrar %s: %v\n", registrar.ReclaimCommand, err)
		os.Exit(1)
	}
}
