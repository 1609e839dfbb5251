package embedded

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// Defaults of the embedded etcd (the single-machine, single-replica deployment).
const (
	DefaultClientURL = "http://127.0.0.1:2379"
	DefaultPeerURL   = "http://127.0.0.1:2380"
)

// Config configures the registrar's embedded etcd, used when no etcd endpoints are
// given.
type Config struct {
	// DataDir is etcd's data directory (created with mode 0700 when missing). Required. The
	// registry survives restarts as long as this directory does.
	DataDir string
	// ClientURL is the URL clients (the agents, other clusters' components) connect to;
	// default DefaultClientURL. https:// needs CertFile and KeyFile; http:// is plaintext, for
	// loopback (the registrar refuses it elsewhere without --registry-insecure).
	ClientURL string
	// CertFile and KeyFile are the PEM serving certificate and key of an https ClientURL
	// (etcd --cert-file, --key-file); both or neither, and only with https.
	CertFile, KeyFile string
	// ClientCAFile, when set, makes the server require client certificates signed by this PEM
	// CA bundle (etcd --client-cert-auth, --trusted-ca-file); with etcd authentication on, a
	// client's user is its certificate's CN (registry.UserName). Only with https.
	ClientCAFile string
	// PeerURL is the (unused, single-member) peer URL; default DefaultPeerURL.
	PeerURL string
	// Name is the member name (default "aether-registry").
	Name string
	// LogFile receives etcd's own log ("" means stderr).
	LogFile string
	// AutoCompactionRetention is how much history etcd keeps, in etcd's periodic mode (default
	// "1h"): watchers that fall further behind re-list.
	AutoCompactionRetention string
	// Logger receives aether's messages about the embedded server (default slog.Default()).
	Logger *slog.Logger
}

// Server is a running embedded etcd server.
type Server struct {
	etcd *embed.Etcd
	// Endpoints are the client URLs to give registry.Config.Endpoints.
	Endpoints []string
}

// Start starts a single-member etcd (go.etcd.io/etcd/server/v3/embed) with its data in
// cfg.DataDir and waits until it serves or ctx ends. It returns an error naming the setting that
// is wrong, or etcd's error when the server does not start. Call Close to stop it.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("start embedded etcd: DataDir: required")
	}
	if cfg.ClientURL == "" {
		cfg.ClientURL = DefaultClientURL
	}
	if cfg.PeerURL == "" {
		cfg.PeerURL = DefaultPeerURL
	}
	if cfg.Name == "" {
		cfg.Name = "aether-registry"
	}
	if cfg.AutoCompactionRetention == "" {
		cfg.AutoCompactionRetention = "1h"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	cu, err := url.Parse(cfg.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: ClientURL %q: %w", cfg.ClientURL, err)
	}
	pu, err := url.Parse(cfg.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: PeerURL %q: %w", cfg.PeerURL, err)
	}
	tlsOn := cu.Scheme == "https"
	switch {
	case cu.Scheme != "http" && !tlsOn:
		return nil, fmt.Errorf("start embedded etcd: ClientURL %q: want http:// or https://", cfg.ClientURL)
	case tlsOn && (cfg.CertFile == "" || cfg.KeyFile == ""):
		return nil, fmt.Errorf("start embedded etcd: ClientURL %q: https needs CertFile and KeyFile", cfg.ClientURL)
	case !tlsOn && (cfg.CertFile != "" || cfg.KeyFile != "" || cfg.ClientCAFile != ""):
		return nil, fmt.Errorf("start embedded etcd: ClientURL %q: a certificate or client CA needs an https:// URL", cfg.ClientURL)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = filepath.Join(cfg.DataDir, "member-data")
	ec.LogLevel = "warn"
	if cfg.LogFile != "" {
		ec.LogOutputs = []string{cfg.LogFile}
	} else {
		ec.LogOutputs = []string{"stderr"}
	}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	if tlsOn {
		ec.ClientTLSInfo = transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile,
			TrustedCAFile: cfg.ClientCAFile, ClientCertAuth: cfg.ClientCAFile != ""}
	}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.AutoCompactionMode = "periodic"
	ec.AutoCompactionRetention = cfg.AutoCompactionRetention
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", cfg.DataDir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("start embedded etcd: not ready: %w", ctx.Err())
	}
	out := &Server{etcd: e}
	for _, u := range ec.AdvertiseClientUrls {
		out.Endpoints = append(out.Endpoints, u.String())
	}
	log.Info("registry: embedded etcd serving", "endpoints", out.Endpoints, "data_dir", cfg.DataDir,
		"tls", tlsOn, "client_certificates", cfg.ClientCAFile != "")
	return out, nil
}

// Err returns a channel that receives the server's fatal errors.
func (e *Server) Err() <-chan error { return e.etcd.Err() }

// Close stops the server gracefully.
func (e *Server) Close() { e.etcd.Close() }
