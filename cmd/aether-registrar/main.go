// Command aether-registrar is aether's per-cluster, leader-elected controller set: MCS export
// (ServiceExport to a registry export mark) and import (ServiceImport and <svc>-clusterset VIP
// Service). With --registry-endpoints empty it embeds a single-member etcd (--registry-data-dir),
// the single-machine, single-replica deployment. See docs/registrar.md for its flags.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	cfg, err := parseConfig(os.Args[1:], os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "aether-registrar: invalid configuration:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "aether-registrar:", err)
		os.Exit(1)
	}
}
