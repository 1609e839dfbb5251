// Command bare is the reference point of the DNS benchmark (bench/dns/run.sh): the smallest
// useful miekg/dns server, a map from name to A record answered with dns.Msg and WriteMsg, no
// metrics, NXDOMAIN without SOA. It serves the same names as bench/dns/server.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/miekg/dns"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18054", "listen address (UDP)")
	names := flag.Int("names", 1000, "number of names svc-<i>.bench.mesh")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, *names); err != nil {
		fmt.Fprintln(os.Stderr, "bare:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr string, names int) error {
	records := map[string]net.IP{}
	for i := range names {
		records[fmt.Sprintf("svc-%d.bench.mesh.", i)] = net.IPv4(10, 96, byte(i/256), byte(i%256)).To4()
	}
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		q := r.Question[0]
		if ip, ok := records[q.Name]; ok && q.Qtype == dns.TypeA {
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: ip}}
		} else if !ok {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	srv := &dns.Server{Addr: addr, Net: "udp", Handler: mux}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return srv.ShutdownContext(context.Background())
	}
}
