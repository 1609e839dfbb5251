// Command aether-agent is aether's node agent (a DaemonSet on the host network): it assembles the
// mesh model from its cluster's API server and the registry and runs the node's parts with it.
// See README.md and docs/agent.md for its flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Getenv)
	if err == nil && !cfg.UninstallCNI {
		err = cfg.validate()
	}
	if errors.Is(err, flag.ErrHelp) {
		return // -h/--help: the flag set printed the usage
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "aether-agent: invalid configuration:", err)
		os.Exit(2)
	}
	if cfg.UninstallCNI {
		if err := uninstallCNI(cfg); err != nil {
			fmt.Fprintln(os.Stderr, "aether-agent:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "aether-agent:", err)
		os.Exit(1)
	}
}
