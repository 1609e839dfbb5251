// Command echo is the substrate's echo server workload. It answers HTTP (every path; /healthz
// for probes), gRPC (any method, e.g. /aether.e2e.Echo/Echo) and raw TCP (one JSON line per line received)
// with a JSON description of itself and of the caller: the peer address and, for HTTP and gRPC,
// the x-forwarded-client-cert header (XFCC, which aether's inbound listener sets) with the
// caller's SPIFFE ID parsed from its URI field.
//
// Flags: -http (default :8080), -grpc (default :9090), -tcp (default :9000), empty disables. The
// pod identity comes from POD_NAME, POD_NAMESPACE and CLUSTER (downward API / pod env).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Reply is what the server answers, as one JSON object.
type Reply struct {
	Server    string `json:"server"`
	Namespace string `json:"namespace,omitempty"`
	Cluster   string `json:"cluster,omitempty"`
	Protocol  string `json:"protocol"`
	Peer      string `json:"peer"`
	Host      string `json:"host,omitempty"`
	Method    string `json:"method,omitempty"`
	Path      string `json:"path,omitempty"`
	XFCC      string `json:"xfcc,omitempty"`
	// CallerID is the URI (SPIFFE ID) of the last element of XFCC.
	CallerID string `json:"callerID,omitempty"`
	Message  string `json:"message,omitempty"`
}

type config struct {
	httpAddr, grpcAddr, tcpAddr, udpAddr string
	self                                 Reply
}

func main() {
	var cfg config
	flag.StringVar(&cfg.httpAddr, "http", ":8080", "HTTP listen address (empty: off)")
	flag.StringVar(&cfg.grpcAddr, "grpc", ":9090", "gRPC (cleartext HTTP/2) listen address (empty: off)")
	flag.StringVar(&cfg.tcpAddr, "tcp", ":9000", "raw TCP listen address (empty: off)")
	flag.StringVar(&cfg.udpAddr, "udp", ":9053", "UDP listen address: each datagram is answered with the Reply (empty: off)")
	flag.Parse()
	host, _ := os.Hostname()
	cfg.self = Reply{Server: envOr("POD_NAME", host), Namespace: os.Getenv("POD_NAMESPACE"), Cluster: os.Getenv("CLUSTER")}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	errc := make(chan error, 4)
	if cfg.httpAddr != "" {
		srv := &http.Server{Addr: cfg.httpAddr, Handler: httpHandler(cfg.self), ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- srv.ListenAndServe() }()
		go func() { <-ctx.Done(); _ = srv.Close() }()
		log.Info("serving HTTP", "addr", cfg.httpAddr)
	}
	if cfg.grpcAddr != "" {
		l, err := net.Listen("tcp", cfg.grpcAddr)
		if err != nil {
			return fmt.Errorf("listen grpc: %w", err)
		}
		srv := grpc.NewServer(grpc.UnknownServiceHandler(grpcHandler(cfg.self)))
		go func() { <-ctx.Done(); srv.Stop() }()
		go func() { errc <- srv.Serve(l) }()
		log.Info("serving gRPC", "addr", cfg.grpcAddr)
	}
	if cfg.tcpAddr != "" {
		l, err := net.Listen("tcp", cfg.tcpAddr)
		if err != nil {
			return fmt.Errorf("listen tcp: %w", err)
		}
		go func() { <-ctx.Done(); l.Close() }()
		go func() { errc <- serveTCP(l, cfg.self) }()
		log.Info("serving TCP", "addr", cfg.tcpAddr)
	}
	if cfg.udpAddr != "" {
		pc, err := net.ListenPacket("udp", cfg.udpAddr)
		if err != nil {
			return fmt.Errorf("listen udp: %w", err)
		}
		go func() { <-ctx.Done(); pc.Close() }()
		go func() { errc <- serveUDP(pc, cfg.self) }()
		log.Info("serving UDP", "addr", cfg.udpAddr)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
}

func httpHandler(self Reply) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		rep := self
		rep.Protocol, rep.Peer, rep.Host, rep.Method, rep.Path = "http", r.RemoteAddr, r.Host, r.Method, r.URL.Path
		rep.XFCC = r.Header.Get("X-Forwarded-Client-Cert")
		rep.CallerID = xfccURI(rep.XFCC)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rep)
	})
	return mux
}

// grpcHandler answers every gRPC method: it reads one google.protobuf.StringValue (the message)
// and answers one StringValue holding the JSON Reply, so no generated code is needed on either
// side (the client calls /aether.e2e.Echo/Echo with wrapperspb values).
func grpcHandler(self Reply) grpc.StreamHandler {
	return func(_ any, stream grpc.ServerStream) error {
		var in wrapperspb.StringValue
		if err := stream.RecvMsg(&in); err != nil {
			return err
		}
		rep := self
		rep.Protocol, rep.Message = "grpc", in.GetValue()
		if m, ok := grpc.MethodFromServerStream(stream); ok {
			rep.Path = m
		}
		if p, ok := peer.FromContext(stream.Context()); ok {
			rep.Peer = p.Addr.String()
		}
		if md, ok := metadata.FromIncomingContext(stream.Context()); ok {
			if v := md.Get("x-forwarded-client-cert"); len(v) > 0 {
				rep.XFCC = v[len(v)-1]
				rep.CallerID = xfccURI(rep.XFCC)
			}
			if v := md.Get(":authority"); len(v) > 0 {
				rep.Host = v[0]
			}
		}
		b, err := json.Marshal(rep)
		if err != nil {
			return err
		}
		return stream.SendMsg(wrapperspb.String(string(b)))
	}
}

// xfccURI returns the URI field of the last element of an XFCC header (Envoy's
// x-forwarded-client-cert: elements separated by ',', fields by ';', values may be quoted).
func xfccURI(h string) string {
	if h == "" {
		return ""
	}
	elems := strings.Split(h, ",")
	for _, f := range strings.Split(elems[len(elems)-1], ";") {
		if k, v, ok := strings.Cut(strings.TrimSpace(f), "="); ok && strings.EqualFold(k, "URI") {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

func serveTCP(l net.Listener, self Reply) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			sc := bufio.NewScanner(c)
			enc := json.NewEncoder(c)
			for sc.Scan() {
				rep := self
				rep.Protocol, rep.Peer, rep.Message = "tcp", c.RemoteAddr().String(), sc.Text()
				if enc.Encode(rep) != nil {
					return
				}
			}
		}()
	}
}

// serveUDP answers each datagram on pc with the Reply (protocol "udp", the datagram as the
// message, its source as the peer) in one datagram.
func serveUDP(pc net.PacketConn, self Reply) error {
	buf := make([]byte, 2048)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		rep := self
		rep.Protocol, rep.Peer, rep.Message = "udp", from.String(), string(buf[:n])
		b, err := json.Marshal(rep)
		if err != nil {
			return err
		}
		_, _ = pc.WriteTo(append(b, '\n'), from)
	}
}
