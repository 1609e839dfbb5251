package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// readiness tracks each part's state; the agent is ready when every registered check passes.
type readiness struct {
	mu     sync.Mutex
	checks map[string]error
	// notes are facts parts report that do not make the agent unready (the capture mode), shown
	// on /readyz after its first line.
	notes map[string]string
}

// note records a fact about part for /readyz.
func (r *readiness) note(part, text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.notes == nil {
		r.notes = map[string]string{}
	}
	r.notes[part] = text
}

// noteLines returns the notes as "part: text" lines, sorted.
func (r *readiness) noteLines() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var lines []string
	for p, t := range r.notes {
		lines = append(lines, p+": "+t+"\n")
	}
	sort.Strings(lines)
	return strings.Join(lines, "")
}

func newReadiness(parts ...string) *readiness {
	r := &readiness{checks: map[string]error{}}
	for _, p := range parts {
		r.checks[p] = errors.New("starting")
	}
	return r
}

// set records part's state (nil: ready).
func (r *readiness) set(part string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checks[part] = err
}

// state returns nil when ready, else an error listing every part that is not, sorted.
func (r *readiness) state() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var bad []string
	for p, err := range r.checks {
		if err != nil {
			bad = append(bad, p+": "+err.Error())
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return errors.New(strings.Join(bad, "; "))
}

// agentMetrics are the agent's own Prometheus metrics.
type agentMetrics struct {
	reg          *prometheus.Registry
	modelVersion prometheus.Gauge
	lastPush     prometheus.Gauge
	rebuilds     prometheus.Counter
	buildSeconds prometheus.Histogram
	events       *prometheus.CounterVec
	ready        prometheus.Gauge
	skipped      prometheus.Gauge
}

func newAgentMetrics() *agentMetrics {
	m := &agentMetrics{
		reg:          prometheus.NewRegistry(),
		modelVersion: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_agent_model_version", Help: "Version of the mesh model last handed to the node's parts."}),
		lastPush:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_agent_last_push_timestamp_seconds", Help: "Unix time of the last model the xDS server built and served to Envoy without error."}),
		rebuilds:     prometheus.NewCounter(prometheus.CounterOpts{Name: "aether_agent_model_rebuilds_total", Help: "Mesh models built."}),
		buildSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "aether_agent_model_build_seconds", Help: "Time to read the sources and assemble one mesh model.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 9)}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aether_agent_source_events_total", Help: "Change events received, by source."}, []string{"source"}),
		ready:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_agent_ready", Help: "1 when every part of the agent is ready."}),
		skipped: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_agent_model_skipped_fields",
			Help: "Fields of Kubernetes objects the last mesh model left out (each logged with object, field and value)."}),
	}
	bi := prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_agent_build_info", Help: "Always 1; labels carry the build (Go version, VCS revision and commit time) and the start time.", ConstLabels: buildLabels()})
	bi.Set(1)
	m.reg.MustRegister(m.modelVersion, m.lastPush, m.rebuilds, m.buildSeconds, m.events, m.ready, m.skipped, bi,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// buildLabels are aether_agent_build_info's labels: the Go version, the VCS revision and commit
// time the binary was built from (runtime/debug.BuildInfo; "unknown" when not stamped, as under
// go test) and the process start time.
func buildLabels() prometheus.Labels {
	l := prometheus.Labels{"go_version": runtime.Version(), "revision": "unknown", "commit_time": "unknown", "started": time.Now().UTC().Format(time.RFC3339)}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				l["revision"] = s.Value
			case "vcs.time":
				l["commit_time"] = s.Value
			}
		}
	}
	return l
}

// serveHealth serves /healthz (the process runs) and /readyz (every part ready; 503 with the
// reasons otherwise) on addr until ctx ends. It returns once the listener is bound.
func serveHealth(ctx context.Context, addr string, r *readiness, m *agentMetrics) (net.Addr, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := r.state(); err != nil {
			m.ready.Set(0)
			http.Error(w, "not ready: "+err.Error()+"\n"+r.noteLines(), http.StatusServiceUnavailable)
			return
		}
		m.ready.Set(1)
		fmt.Fprint(w, "ok\n"+r.noteLines())
	})
	return serve(ctx, "tcp", addr, "--health-addr", mux)
}

// serveMetrics serves /metrics (the Prometheus exposition) and nothing else on addr until ctx
// ends; it reaches the cluster's Prometheus, so it carries no other endpoint.
func serveMetrics(ctx context.Context, addr string, m *agentMetrics) (net.Addr, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	return serve(ctx, "tcp", addr, "--metrics-addr", mux)
}

// serveDebug serves Go's runtime profiles (net/http/pprof, /debug/pprof/) on a unix socket at
// path, created 0600 (a stale file there is replaced), until ctx ends: a profile can stall the
// agent and a trace shows its data, so only root on the node reaches it.
func serveDebug(ctx context.Context, path string) (net.Addr, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("--debug-socket %s: %w", path, err)
	}
	_ = os.Remove(path)
	a, err := serve(ctx, "unix", path, "--debug-socket", mux)
	if err != nil {
		return nil, err
	}
	// As the CNI socket: hostNetwork pods share the node's network, not its files, and the
	// directory is root's.
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, fmt.Errorf("--debug-socket %s: %w", path, err)
	}
	return a, nil
}

// serve serves h on a listener of network at addr until ctx ends; flag names the setting in the
// listen error.
func serve(ctx context.Context, network, addr, flag string, h http.Handler) (net.Addr, error) {
	l, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s %s: %w", flag, addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return l.Addr(), nil
}
