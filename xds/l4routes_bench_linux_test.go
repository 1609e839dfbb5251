package xds

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// BenchmarkL4RouteOtherPaths measures what mesh TLSRoutes (and a TCPRoute) cost the paths they
// are not on, in one run: two L4 fixtures side by side, one without L4 routes ("plain") and one
// with TLSRoutes on 8443 and a TCPRoute on another Service ("routed": its capture listeners run
// the tls_inspector on 8443), each sample a new connection from a captured pod, interleaved at
// 100 connections per second (paceInterleaved): TCP to a VIP on a port without TLSRoutes
// (connect, a 1 KB echo, close), an HTTP GET on a new connection, and a TLS handshake and one
// line to the TLS-routed VIP (to the Service's own backend in plain, through the TLSRoute's SNI
// match in routed). It prints p50/p90/p99/p99.9 of each path and the routed fixture's added
// values against the plain one's; AETHER_BENCH_SAMPLES sets the samples per path (default 2000),
// AETHER_BENCH_ENVOY_CPUS / AETHER_BENCH_LOAD_CPUS pin both Envoys and this process.
//
//	sudo go test ./xds/ -run '^$' -bench BenchmarkL4RouteOtherPaths -benchtime 1x
func BenchmarkL4RouteOtherPaths(b *testing.B) {
	testenv.RequireRoot(b)
	samples := testenv.BenchEnv(b, "AETHER_BENCH_SAMPLES", 2000)
	plain, routed := startL4Fixture(b, true, Options{}), startL4Fixture(b, true, Options{})
	plain.set(plain.mesh(b, 2, nil))
	// The TCPRoute is on web/banner, not on the TCP path measured.
	banner := tcpRouteSplit()
	banner.Parents[0] = model.ParentRef{Kind: model.ParentService, Service: model.ServiceKey{Namespace: "web", Name: "banner"}, Port: 25}
	routed.set(routed.mesh(b, 2, append(tlsRoutes(), banner)))
	pin := pinBench(b, plain.sup.PID(), routed.sup.PID())
	body := bytes.Repeat([]byte("x"), 1024)
	tcp := func(name string, f *l4Fixture) pacePath {
		buf := make([]byte, len(body))
		return pacePath{name, func() error { return dialEcho(f.pods["alpha"], vipTCP.String()+":9000", body, buf) }}
	}
	http := func(name string, f *l4Fixture) pacePath {
		c := f.pods["alpha"].HTTPClient(false)
		return pacePath{name, func() error {
			code, _, _, err := getBody(c, "http://"+vipHTTP.String()+"/", nil)
			if err == nil && code != 200 {
				err = fmt.Errorf("status %d", code)
			}
			return err
		}}
	}
	tls := func(name string, f *l4Fixture, cert string) pacePath {
		return pacePath{name, func() error {
			_, _, err := f.tlsPeer(f.pods["alpha"], vipTLS.String()+":8443", "v1.example", cert)
			return err
		}}
	}
	paths := []pacePath{
		tcp("plain", plain), tcp("routed", routed),
		http("plain", plain), http("routed", routed),
		tls("plain", plain, "default.example"), tls("routed", routed, "v1.example"),
	}
	fmt.Printf("BenchmarkL4RouteOtherPaths: %d new connections per path at 100/s, %s, loadavg %s\n", samples, pin, loadavg())
	if _, err := paceInterleaved(100, 100, 10, paths); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
	r, err := paceInterleaved(100, samples, 10, paths)
	if err != nil {
		b.Fatal(err)
	}
	for i, kind := range []string{"tcp", "http", "tls"} {
		pair := &paceResult{sched: r.sched[2*i : 2*i+2], svc: r.svc[2*i : 2*i+2], pacing: r.pacing, elapsed: r.elapsed}
		reportPaced(b, "l4-"+kind+"-", paths[2*i:2*i+2], pair)
	}
}
