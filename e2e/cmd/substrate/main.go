//go:build linux

// Command substrate starts and stops aether's local two-cluster substrate (e2e/substrate) as
// root, without Docker:
//
//	substrate up [-identical-pod-cidrs] [-keep-dir]   start, print where everything is, run until SIGINT/SIGTERM
//	substrate down                                    stop the running substrate(s) started by "up"
//	substrate clean [-force]                          remove what crashed runs left behind (make e2e-clean)
//
// Run it from the repository (it finds the cached tools through hack/versions.env).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aethermesh/aether/e2e/substrate"
	"github.com/aethermesh/aether/internal/testenv"
)

type config struct {
	cmd           string
	identical     bool
	realNodes     bool
	keepDir       bool
	force         bool
	baseDir       string
	buildWorkload bool
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: substrate up|down|clean [flags]")
		os.Exit(2)
	}
	cfg := config{cmd: os.Args[1]}
	fs := flag.NewFlagSet(cfg.cmd, flag.ExitOnError)
	fs.BoolVar(&cfg.identical, "identical-pod-cidrs", false, "up: give both clusters 10.244.0.0/16 (Flannel's default)")
	fs.BoolVar(&cfg.realNodes, "real-nodes", false, "up: real nodes (containerd, kubelet, kube-proxy; docs/substrate.md)")
	fs.BoolVar(&cfg.keepDir, "keep-dir", false, "up: keep the run directory (logs) after shutdown")
	fs.BoolVar(&cfg.buildWorkload, "workloads", true, "up: build the test workloads into <run dir>/bin")
	fs.BoolVar(&cfg.force, "force", false, "clean: also clean runs whose owner still runs")
	fs.StringVar(&cfg.baseDir, "base-dir", os.TempDir(), "where run directories (aesub-*) live")
	_ = fs.Parse(os.Args[2:])
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		fmt.Fprintln(os.Stderr, "substrate:", err)
		os.Exit(1)
	}
}

// run executes one command; up runs until ctx ends (SIGINT or SIGTERM).
func run(ctx context.Context, cfg config, log *slog.Logger) error {
	switch cfg.cmd {
	case "up":
		return up(ctx, cfg, log)
	case "down":
		return down(cfg, log)
	case "clean":
		dirs, err := substrate.Clean(cfg.baseDir, cfg.force, log)
		fmt.Printf("leftover runs cleaned (crashed or killed runs whose processes or mounts remained): %d\n", len(dirs))
		return err
	}
	return fmt.Errorf("unknown command %q: want up, down or clean", cfg.cmd)
}

func up(ctx context.Context, cfg config, log *slog.Logger) error {
	b := "10.245.0.0/16"
	if cfg.identical {
		b = "10.244.0.0/16"
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	s, err := substrate.Start(sctx, substrate.Options{
		Clusters: substrate.DefaultClusters("10.244.0.0/16", b), BaseDir: cfg.baseDir, KeepDir: cfg.keepDir, Logger: log,
		RealNodes: cfg.realNodes,
	})
	if err != nil {
		return err
	}
	defer s.Stop()
	var bins map[string]string
	if cfg.buildWorkload {
		if bins, err = substrate.BuildWorkloads(sctx, filepath.Join(s.Dir, "bin")); err != nil {
			return err
		}
		if cfg.realNodes {
			if err := s.PushWorkloadImages(sctx); err != nil {
				return err
			}
		}
	}
	total, _, _ := s.Memory()
	env := describe(s, bins)
	if err := os.WriteFile(filepath.Join(s.Dir, "substrate.env"), []byte(env), 0o644); err != nil {
		return err
	}
	fmt.Print(env)
	fmt.Printf("# up in %v, %d MiB resident; stop with Ctrl-C or: make substrate-down\n", s.StartupTime.Round(time.Millisecond), total>>20)
	<-ctx.Done()
	fmt.Println("# shutting down")
	return nil
}

// describe renders where everything is as shell variable assignments.
func describe(s *substrate.Substrate, bins map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "AESUB_DIR=%s\nAESUB_CA_CERT=%s\nAESUB_REGISTRY=%s\nAESUB_REGISTRY_CA=%s\nAESUB_REGISTRY_CERT=%s\nAESUB_REGISTRY_KEY=%s\nAESUB_UNDERLAY_NETNS=%s\n",
		s.Dir, s.CACertFile, s.RegistryEndpoint, s.RegistryCAFile, s.RegistryRootCertFile, s.RegistryRootKeyFile, s.Underlay.Path)
	for _, c := range s.Clusters {
		up := strings.ToUpper(c.Name)
		fmt.Fprintf(&b, "AESUB_%s_KUBECONFIG=%s\nAESUB_%s_POD_CIDR=%s\nAESUB_%s_NODE_KUBECONFIG=%s\n", up, c.Kubeconfig, up, c.Plan.PodCIDR, up, c.NodeKubeconfig)
		for _, n := range c.Nodes {
			v := strings.ToUpper(strings.ReplaceAll(n.Name, "-", "_"))
			fmt.Fprintf(&b, "AESUB_%s_NETNS=%s  # node IP %s, pod subnet %s, root %s\n", v, n.Netns.Path, n.Plan.IP, n.Plan.PodSubnet, n.Root)
			if m := n.MountNamespace(); m != "" {
				crictl := "crictl"
				if tl, err := testenv.FindTools(); err == nil {
					crictl = tl.Crictl
				}
				fmt.Fprintf(&b, "AESUB_%s_MNTNS=%s  # nsenter --net=$AESUB_%s_NETNS --mount=$AESUB_%s_MNTNS %s -r unix:///run/containerd/containerd.sock ps\n", v, m, v, v, crictl)
			}
		}
	}
	for name, p := range bins {
		fmt.Fprintf(&b, "AESUB_BIN_%s=%s\n", strings.ToUpper(name), p)
	}
	return b.String()
}

// down signals every run directory's owner (a running "substrate up") and waits for it to go.
func down(cfg config, log *slog.Logger) error {
	dirs, _ := filepath.Glob(filepath.Join(cfg.baseDir, substrate.Prefix+"*"))
	n := 0
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 1 {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if strings.TrimSpace(string(comm)) != "substrate" {
			continue // a test or a dead owner: not ours to stop; clean handles dead ones
		}
		log.Info("stopping", "pid", pid, "dir", d)
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			continue
		}
		for i := 0; i < 600 && syscall.Kill(pid, 0) == nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
		n++
	}
	fmt.Printf("stopped %d substrate(s)\n", n)
	return nil
}
