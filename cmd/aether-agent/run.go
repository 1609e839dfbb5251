package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aethermesh/aether/model"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"
)

// run starts the agent's parts in an order that never exposes a half-ready node and blocks until
// ctx ends. Envoy is its own process and keeps serving its last configuration after run returns.
func run(ctx context.Context, cfg config) error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	log = log.With("node", cfg.NodeName, "cluster", cfg.Cluster)
	ready := newReadiness("kubernetes", "model")
	metrics := newAgentMetrics()
	haddr, err := serveHealth(ctx, cfg.HealthAddr, ready, metrics)
	if err != nil {
		return err
	}
	log.Info("health endpoints up", "addr", haddr.String())

	rc, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	mcs, err := mcsclient.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("MCS client: %w", err)
	}

	var asm *model.Assembler
	kube, err := model.NewKubeSource(cs, mcs, cfg.NodeName, 0, func() {
		metrics.events.WithLabelValues("kubernetes").Inc()
		asm.Trigger()
	})
	if err != nil {
		return err
	}
	asm = model.NewAssembler(model.AssemblerConfig{
		Cluster: cfg.Cluster, MeshDomain: cfg.MeshDomain, TrustDomain: cfg.TrustDomain, Logger: log,
	}, kube, nil, nil)
	asm.Subscribe(func(m *model.Mesh) {
		metrics.rebuilds.Inc()
		metrics.modelVersion.Set(float64(m.Version))
		metrics.lastPush.SetToCurrentTime()
		for _, c := range m.ShortNameClashes() {
			log.Warn("short mesh name clash: oldest service keeps the short name", "name", c.Name+"."+m.MeshDomain, "winner", c.Winner.String(), "losers", fmt.Sprint(c.Losers))
		}
	})

	syncCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = kube.Start(syncCtx)
	cancel()
	if err != nil {
		return err
	}
	if err := asm.Rebuild(); err != nil {
		return err
	}
	ready.set("model", nil)
	go asm.Run(ctx)
	go watchHealth(ctx, "kubernetes", ready, log, func(ctx context.Context) error { return kube.Healthy(ctx, 5*time.Second) })

	log.Info("agent running", "model_version", asm.Current().Version)
	<-ctx.Done()
	log.Info("agent stopping; Envoy keeps serving its last configuration")
	return nil
}

// watchHealth probes a source every 2 s and records its state in ready: the agent reports
// degraded readiness with the reason while the source is down and keeps serving the last model.
func watchHealth(ctx context.Context, part string, ready *readiness, log *slog.Logger, probe func(context.Context) error) {
	var last error
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		err := probe(ctx)
		ready.set(part, err)
		if (err == nil) != (last == nil) {
			if err != nil {
				log.Warn("source unavailable; serving the last model", "source", part, "err", err)
			} else {
				log.Info("source back", "source", part)
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster kubernetes config (set --kubeconfig outside a cluster): %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %q: %w", kubeconfig, err)
	}
	return c, nil
}
