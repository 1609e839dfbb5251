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
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/aethermesh/aether/registrar"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case registrar.SetupAuthCommand:
			subcommand(registrar.SetupAuthCommand, os.Args[2:], registrar.ParseAuthConfig, registrar.SetupAuth)
			return
		case registrar.ReclaimCommand:
			subcommand(registrar.ReclaimCommand, os.Args[2:], registrar.ParseReclaimConfig, registrar.Reclaim)
			return
		}
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

// subcommand runs `aether-registrar <name> args...`: parse reads its flags (with environment
// defaults), run does the work and prints its outcome to stdout. It exits 2 on bad input
// (nothing is changed) and 1 when run fails: setup-registry-auth when etcd refused,
// reclaim-partition when the claim names another cluster ID than --previous-cluster-id or the
// API server or etcd failed.
func subcommand[C any](name string, args []string, parse func([]string, func(string) string) (C, error),
	run func(context.Context, C, io.Writer) error) {
	c, err := parse(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "aether-registrar %s: invalid configuration: %v\n", name, err)
		os.Exit(2)
	}
	if err := run(context.Background(), c, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "aether-registrar %s: %v\n", name, err)
		os.Exit(1)
	}
}
