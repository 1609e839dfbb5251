package main

import (
	"context"
	"github.com/aethermesh/aether/internal/kubeconfig"
	"log/slog"
	"os"
	"path/filepath"

	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registrar/registry"
)

// run connects to (or embeds) the registry and runs the registrar until ctx ends or it loses
// its leader lease.
func run(ctx context.Context, cfg config) error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel})).With("cluster", cfg.Cluster, "region", cfg.Region)
	rc, err := kubeconfig.RESTConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = float32(cfg.KubeQPS), cfg.KubeBurst

	endpoints := cfg.Registry.Endpoints()
	if len(endpoints) == 0 {
		emb, err := registry.StartEmbedded(ctx, registry.EmbeddedConfig{
			DataDir: cfg.RegistryDataDir, ClientURL: cfg.RegistryListen, PeerURL: cfg.RegistryPeer,
			LogFile: filepath.Join(cfg.RegistryDataDir, "etcd.log"), Logger: log,
		})
		if err != nil {
			return err
		}
		defer emb.Close()
		endpoints = emb.Endpoints
	}
	rcfg := registry.Config{
		Endpoints: endpoints, Username: cfg.RegistryUser, Password: cfg.RegistryPassword,
		Region: cfg.Region, Cluster: cfg.Cluster, Logger: log, Metrics: ctrlmetrics.Registry,
	}
	if rcfg.TLS, err = cfg.Registry.TLS(); err != nil {
		return err
	}
	reg, err := registry.New(rcfg)
	if err != nil {
		return err
	}
	defer reg.Close()

	r, err := registrar.New(registrar.Config{
		Kube: rc, Exports: reg, Probe: registrar.EtcdProbe(reg.Client()), ProbeInterval: cfg.RegistryProbe,
		LeaderElection: cfg.LeaderElect, LeaderElectionID: cfg.LeaderElectID, LeaderElectionNamespace: cfg.LeaderElectNamespace,
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
		ReleaseOnCancel: cfg.ReleaseOnCancel,
		MetricsAddr:     cfg.MetricsAddr, HealthAddr: cfg.HealthAddr, Metrics: ctrlmetrics.Registry,
		Workers: cfg.Workers, Logger: log,
	})
	if err != nil {
		return err
	}
	log.Info("registrar starting", "registry", endpoints, "leader_elect", cfg.LeaderElect)
	return r.Start(ctx)
}
