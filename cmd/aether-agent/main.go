// Command aether-agent is aether's node agent (a DaemonSet on the host network): it parses its
// configuration (flags, with environment defaults) and runs package agent with it. See README.md
// and docs/agent.md for its flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/aethermesh/aether/agent"
)

func main() {
	cfg, err := agent.ParseFlags(os.Args[1:], os.Getenv)
	if err == nil && !cfg.UninstallCNI {
		err = cfg.Validate()
	}
	if errors.Is(err, flag.ErrHelp) {
		return // -h/--help: the flag set printed the usage
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "aether-agent: invalid configuration:", err)
		os.Exit(2)
	}
	if cfg.UninstallCNI {
		if err := agent.UninstallCNI(cfg); err != nil {
			fmt.Fprintln(os.Stderr, "aether-agent:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := agent.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "aether-agent:", err)
		os.Exit(1)
	}
}
