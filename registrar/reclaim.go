package registrar

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/aethermesh/aether/internal/envflag"
	"github.com/aethermesh/aether/internal/kubeconfig"
	"github.com/aethermesh/aether/registry"
)

// ReclaimCommand is the subcommand that re-claims this cluster's registry partition after the
// cluster that claimed it was rebuilt.
const ReclaimCommand = "reclaim-partition"

// ReclaimConfig is the configuration of `aether-registrar reclaim-partition`: the registrar's
// cluster and registry flags, and the cluster ID to replace.
type ReclaimConfig struct {
	target
	PreviousClusterID string        // --previous-cluster-id: the cluster ID the claim names now
	Timeout           time.Duration // --timeout
}

// ParseReclaimConfig reads the subcommand's flags (args after its name) with environment
// defaults from getenv. Each error names the flag and its value.
func ParseReclaimConfig(args []string, getenv func(string) string) (ReclaimConfig, error) {
	var c ReclaimConfig
	fs := flag.NewFlagSet("aether-registrar "+ReclaimCommand, flag.ContinueOnError)
	ef := &envflag.Set{FS: fs, Getenv: getenv}
	c.target.define(ef, fs, getenv)
	fs.StringVar(&c.PreviousClusterID, "previous-cluster-id", "", "the cluster ID the partition's claim names now: the kube-system Namespace UID of the cluster this one replaces, as the refusing registrar printed it (required)")
	fs.DurationVar(&c.Timeout, "timeout", 2*time.Minute, "how long the whole re-claim may take")
	if err := ef.Parse(args); err != nil {
		return c, err
	}
	errs := c.target.validate()
	if c.PreviousClusterID == "" {
		errs = append(errs, errors.New("--previous-cluster-id is required: the cluster ID the partition's claim names now (the registrar's error prints it)"))
	} else if err := registry.ValidateClusterID("--previous-cluster-id", c.PreviousClusterID); err != nil {
		errs = append(errs, err)
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %s: want a positive duration", c.Timeout))
	}
	return c, errors.Join(errs...)
}

// Reclaim gives this cluster (the one --kubeconfig reaches) the registry partition of its
// cluster name, replacing the claim of --previous-cluster-id, and prints the outcome to out. It
// is idempotent: when this cluster already holds the claim it changes nothing. It returns an
// error when the claim names another cluster ID than --previous-cluster-id (nothing changed)
// or when the API server or etcd fails.
func Reclaim(ctx context.Context, c ReclaimConfig, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rc, err := kubeconfig.RESTConfig(c.Kubeconfig)
	if err != nil {
		return err
	}
	reg, id, closeReg, err := openRegistry(ctx, c.target, rc, log, claimedBy("aether-registrar "+ReclaimCommand), 0)
	if err != nil {
		return err
	}
	defer closeReg()
	claim, changed, err := reg.Reclaim(ctx, c.PreviousClusterID)
	if err != nil {
		return err
	}
	o := reg.Origin()
	switch {
	case !changed:
		fmt.Fprintf(out, "registry partition %s: already claimed by this cluster (cluster ID %s) since %s; nothing changed\n", o, id, claim.GetClaimTime())
	case claim.GetPreviousClusterId() == "":
		fmt.Fprintf(out, "registry partition %s: claimed by this cluster (cluster ID %s); it had no claim\n", o, id)
	default:
		fmt.Fprintf(out, "registry partition %s: claimed by this cluster (cluster ID %s), replacing cluster ID %s\n", o, id, claim.GetPreviousClusterId())
	}
	return nil
}

// claimedBy names a process of this command on this host, for a claim's claimed_by.
func claimedBy(command string) string {
	host, _ := os.Hostname()
	return command + " on host " + host
}
