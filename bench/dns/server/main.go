// Command server runs the agent's DNS resolver (package dnsd) for the DNS benchmark
// (bench/dns/run.sh): a mesh model of -names services svc-<i> in namespace bench, VIPs
// 10.96.<i/256>.<i%256>, TTL -ttl, in mesh domain -mesh-domain, served on -addr over UDP and TCP until
// SIGINT or SIGTERM. Other names are forwarded to -upstream through a cache of -cache-size
// answers (the agent's default size).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aethermesh/aether/dnsd"
	"github.com/aethermesh/aether/model"
)

type config struct {
	addr       string
	names      int
	cpuprofile string
	meshDomain string
	upstream   string
	cacheSize  int
	ttl        uint
}

func main() {
	var cfg config
	flag.StringVar(&cfg.addr, "addr", "127.0.0.1:18054", "listen address (UDP and TCP)")
	flag.IntVar(&cfg.names, "names", 1000, "number of mesh services")
	flag.StringVar(&cfg.cpuprofile, "cpuprofile", "", "write a CPU profile to this file")
	flag.StringVar(&cfg.meshDomain, "mesh-domain", "mesh", "mesh domain of the names")
	flag.StringVar(&cfg.upstream, "upstream", "", "upstream (ip:port) for the other names (empty: none, SERVFAIL)")
	flag.IntVar(&cfg.cacheSize, "cache-size", dnsd.DefaultCacheSize, "forwarded answers cached (0: no cache)")
	flag.UintVar(&cfg.ttl, "ttl", dnsd.DefaultTTL, "TTL of the names' A records, seconds")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if cfg.cpuprofile != "" {
		f, err := os.Create(cfg.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var svcs []*model.Service
	for i := range cfg.names {
		svcs = append(svcs, &model.Service{
			Key:   model.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)},
			Local: true,
			VIPs:  []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i / 256), byte(i % 256)})},
		})
	}
	m := model.New(1, "bench", cfg.meshDomain, "", model.Node{Name: "bench"}, svcs, nil, nil)
	var upstreams []string
	if cfg.upstream != "" {
		upstreams = []string{cfg.upstream}
	}
	fwd, err := dnsd.NewForwarder(upstreams, dnsd.ForwarderOptions{Logger: log})
	if err != nil {
		return err
	}
	// A registry like the agent's, so the metrics cost what they cost in production.
	res, err := dnsd.NewResolver(fwd, dnsd.ResolverOptions{Registerer: prometheus.NewRegistry(), Logger: log,
		MeshDomain: cfg.meshDomain, Cache: dnsd.CacheOptions{Size: cfg.cacheSize}, Index: dnsd.IndexOptions{TTL: uint32(cfg.ttl)}})
	if err != nil {
		return err
	}
	if err := res.Update(m); err != nil {
		return err
	}
	srv := dnsd.NewServer(res, dnsd.ServerConfig{Addr: cfg.addr, Logger: log})
	if err := srv.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	return srv.Shutdown(context.Background())
}
