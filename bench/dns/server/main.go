// Command server runs the agent's DNS resolver (package dnsd) for the DNS benchmark
// (bench/dns/run.sh): a mesh model of -names services svc-<i> in namespace bench, VIPs
// 10.96.<i/256>.<i%256>, served on -addr over UDP and TCP until SIGINT or SIGTERM.
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
}

func main() {
	var cfg config
	flag.StringVar(&cfg.addr, "addr", "127.0.0.1:18054", "listen address (UDP and TCP)")
	flag.IntVar(&cfg.names, "names", 1000, "number of mesh services")
	flag.StringVar(&cfg.cpuprofile, "cpuprofile", "", "write a CPU profile to this file")
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
	m := model.New(1, "bench", "", "", model.Node{Name: "bench"}, svcs, nil, nil)
	fwd, err := dnsd.NewForwarder(nil, dnsd.ForwarderOptions{Logger: log})
	if err != nil {
		return err
	}
	// A registry like the agent's, so the metrics cost what they cost in production.
	res, err := dnsd.NewResolver(fwd, dnsd.ResolverOptions{Registerer: prometheus.NewRegistry(), Logger: log})
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
