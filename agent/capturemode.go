package agent

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	bpfcapture "github.com/aethermesh/aether/bpf/capture"
	"github.com/aethermesh/aether/capture"
)

// The values of --capture-mode.
const (
	captureNFT  = "nft"
	captureEBPF = "ebpf"
	captureAuto = "auto"
)

// captureMetrics are the capture mode's metrics (docs/ebpf.md, "How to check a node's mode").
type captureMetrics struct {
	mode         *prometheus.GaugeVec
	podFallbacks prometheus.Counter
}

func newCaptureMetrics(reg prometheus.Registerer) *captureMetrics {
	m := &captureMetrics{
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "aether_capture_mode",
			Help: "1 for the capture mode this node runs (mode: ebpf or nft); reason is why auto fell back to nft (empty when it did not)."}, []string{"mode", "reason"}),
		podFallbacks: prometheus.NewCounter(prometheus.CounterOpts{Name: "aether_capture_pod_fallbacks_total",
			Help: "Pods whose eBPF settings could not be loaded and that were captured by nft rules instead."}),
	}
	reg.MustRegister(m.mode, m.podFallbacks)
	return m
}

// captureBackend returns the capture backend of cfg's --capture-mode and --capture-backend, and
// reports the mode it chose (the log, aether_capture_mode, the "capture" note of /readyz). In
// auto mode a node where eBPF capture cannot run (Probe, the bpffs at --bpffs-dir, Envoy's
// cgroup, Ensure) falls back to the rules of --capture-backend; in ebpf mode that is an error
// naming the flag, its value and what is missing. The returned close releases the programs'
// handles (their pins keep them attached).
func captureBackend(cfg Config, ready *readiness, reg prometheus.Registerer, log *slog.Logger) (capture.Backend, func(), error) {
	rules, err := capture.NewBackend(cfg.CaptureBackend)
	if err != nil {
		return nil, nil, fmt.Errorf("--capture-backend: %w", err)
	}
	m := newCaptureMetrics(reg)
	if cfg.CaptureMode == captureNFT || cfg.CaptureMode == "" {
		m.mode.WithLabelValues(captureNFT, "").Set(1)
		ready.note("capture", "nft (--capture-mode nft)")
		log.Info("capture mode chosen", "mode", captureNFT, "capture-mode", cfg.CaptureMode)
		return retireEBPF(rules, cfg.BPFFSDir, log)
	}
	c, cgroup, err := startEBPF(cfg.BPFFSDir)
	if err != nil {
		if cfg.CaptureMode == captureEBPF {
			return nil, nil, fmt.Errorf("--capture-mode %s: %w", cfg.CaptureMode, err)
		}
		m.mode.WithLabelValues(captureNFT, err.Error()).Set(1)
		ready.note("capture", "nft (--capture-mode auto fell back: "+err.Error()+")")
		log.Warn("capture mode chosen: eBPF capture cannot run here, falling back to nft", "mode", captureNFT, "capture-mode", cfg.CaptureMode, "reason", err.Error())
		return retireEBPF(rules, cfg.BPFFSDir, log)
	}
	m.mode.WithLabelValues(captureEBPF, "").Set(1)
	ready.note("capture", fmt.Sprintf("ebpf (--capture-mode %s, attached to %s, pinned in %s)", cfg.CaptureMode, cgroup, cfg.BPFFSDir))
	log.Info("capture mode chosen", "mode", captureEBPF, "capture-mode", cfg.CaptureMode, "cgroup", cgroup, "bpffs-dir", cfg.BPFFSDir)
	b := &bpfcapture.Backend{Capture: c, NFT: rules, Log: log.With("part", "capture-ebpf"),
		OnFallback: func(string, error) { m.podFallbacks.Inc() }}
	return b, func() { _ = c.Close() }, nil
}

// startEBPF probes the kernel, makes dir a bpffs directory, checks that this process (and so the
// Envoy it supervises, which inherits its cgroup) sits under the cgroup2 root the programs attach
// to, and adopts or loads, attaches and pins the programs (bpfcapture.Ensure). It returns the
// programs and the cgroup they are attached to, or an error saying what is missing.
func startEBPF(dir string) (*bpfcapture.Capture, string, error) {
	r := bpfcapture.Probe()
	if err := r.Err(); err != nil {
		return nil, "", err
	}
	if err := ensureBPFFS(dir); err != nil {
		return nil, "", fmt.Errorf("--bpffs-dir %s: %w", dir, err)
	}
	// The programs attach at the cgroup2 root: every process is under it, the pods' and Envoy's
	// (an accepted socket belongs to its listener's cgroup; docs/ebpf.md). Only the hierarchy's
	// true root lacks cgroup.type: a mount seen through a cgroup namespace (a container's own
	// /sys/fs/cgroup) shows a subtree that holds neither the pods nor Envoy.
	if _, err := os.Stat(filepath.Join(r.CgroupV2, "cgroup.type")); err == nil {
		return nil, "", fmt.Errorf("cgroup2 mount %s: not the root of the host's cgroup2 hierarchy (a cgroup namespace or a subtree): the pods' sockets would not be under it", r.CgroupV2)
	}
	if err := underCgroup(os.Getpid(), r.CgroupV2); err != nil {
		return nil, "", fmt.Errorf("envoy's cgroup: %w", err)
	}
	c, err := bpfcapture.Ensure(dir, r.CgroupV2)
	if err != nil {
		return nil, "", err
	}
	return c, r.CgroupV2, nil
}

// retireEBPF returns the nft backend rules, wrapped, when dir holds the pins of an earlier eBPF
// agent, in a bpfcapture.Backend that retires them: each pod gets its whole nft rule set before
// its map entries go, and the pins go once no pod is left (the repair pass at start does both),
// so no pod is uncaptured meanwhile and none keeps stale eBPF settings.
func retireEBPF(rules capture.Backend, dir string, log *slog.Logger) (capture.Backend, func(), error) {
	if dir == "" {
		return rules, func() {}, nil
	}
	if _, err := os.Stat(filepath.Join(dir, "map_pods")); err != nil {
		return rules, func() {}, nil
	}
	c, err := bpfcapture.OpenPinned(dir)
	if err != nil {
		log.Warn("eBPF pins of an earlier agent cannot be opened: left as they are (their pods are captured by both)", "bpffs-dir", dir, "err", err)
		return rules, func() {}, nil
	}
	log.Info("eBPF pins of an earlier agent found: their pods move to nft and the pins go", "bpffs-dir", dir)
	b := &bpfcapture.Backend{Capture: c, NFT: rules, Retire: true, PinDir: dir, Log: log.With("part", "capture-ebpf")}
	return b, func() { _ = c.Close() }, nil
}
