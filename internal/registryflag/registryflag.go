// Package registryflag defines the registry client flags aether's binaries share
// (--registry-endpoints, --registry-ca, --registry-cert, --registry-key, each with its
// AETHER_REGISTRY_* variable) and checks them, so aether-agent, aether-registrar and
// `aether-registrar setup-registry-auth` spell, document and check them one way. It owns these
// four flags only; connecting to the registry is package registry's (registry.TLSFiles).
package registryflag

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"

	"github.com/aethermesh/aether/internal/envflag"
	"github.com/aethermesh/aether/registry"
)

// Default help texts; Usage overrides them per binary.
const (
	defaultEndpointsUsage = "comma-separated etcd client URLs of the registry"
	defaultCertUsage      = "client certificate for the registry"
)

// Flags are the registry client flags' values after parsing.
type Flags struct {
	endpoints string // --registry-endpoints as given; Endpoints splits it
	// CA is --registry-ca (AETHER_REGISTRY_CA): the PEM bundle that signed etcd's serving
	// certificate; empty: the system roots (or plaintext when Cert and Key are empty too).
	CA string
	// Cert and Key are --registry-cert and --registry-key (AETHER_REGISTRY_CERT, _KEY): the
	// client certificate and key (PEM files), both or neither.
	Cert, Key string
	// Insecure is --registry-insecure (AETHER_REGISTRY_INSECURE): allow plaintext (http://)
	// endpoints that are not on loopback, and an etcd user other than the cluster's own
	// (registry.Config.AllowForeignUser). Off by default, since every cluster's endpoints, its
	// etcd credentials and the partition claims cross that connection, and a shared user could
	// write every partition.
	Insecure bool
}

// Usage replaces a flag's help text for one binary; an empty field keeps the default.
type Usage struct {
	// Endpoints is --registry-endpoints' text (default "comma-separated etcd client URLs of the
	// registry").
	Endpoints string
	// Cert is --registry-cert's text (default "client certificate for the registry").
	Cert string
}

// Define defines the four flags on ef, storing their values in f. Each flag's default is its
// variable's value, else empty (envflag).
func (f *Flags) Define(ef *envflag.Set, u Usage) {
	if u.Endpoints == "" {
		u.Endpoints = defaultEndpointsUsage
	}
	if u.Cert == "" {
		u.Cert = defaultCertUsage
	}
	ef.StringVar(&f.endpoints, "registry-endpoints", "AETHER_REGISTRY_ENDPOINTS", "", u.Endpoints)
	ef.StringVar(&f.CA, "registry-ca", "AETHER_REGISTRY_CA", "", "CA bundle for the registry's TLS")
	ef.StringVar(&f.Cert, "registry-cert", "AETHER_REGISTRY_CERT", "", u.Cert)
	ef.StringVar(&f.Key, "registry-key", "AETHER_REGISTRY_KEY", "", "client key for the registry")
	ef.BoolVar(&f.Insecure, "registry-insecure", "AETHER_REGISTRY_INSECURE", "allow plaintext http:// registry endpoints off loopback (they carry every cluster's endpoints and the etcd credentials; use https:// with --registry-ca instead), and, with etcd authentication on, an etcd user that is not this cluster's own (registry.UserName)")
}

// Endpoints returns --registry-endpoints split at commas, trimmed, empty items dropped (nil for
// none).
func (f Flags) Endpoints() []string { return envflag.List(f.endpoints) }

// CheckTLS checks the TLS flags: --registry-cert and --registry-key go together, every file
// given exists, and no endpoint is plaintext (http://) off loopback unless --registry-insecure
// (PlaintextEndpoints). Each error names the flag and its value; nil when all is well.
func (f Flags) CheckTLS() []error {
	var errs []error
	if !f.Insecure {
		for _, e := range f.PlaintextEndpoints() {
			errs = append(errs, fmt.Errorf("--registry-endpoints %q: plaintext to a registry off loopback: use https:// with --registry-ca (and --registry-cert/--registry-key where etcd wants client certificates), or set --registry-insecure", e))
		}
	}
	if (f.Cert == "") != (f.Key == "") {
		errs = append(errs, errors.New("--registry-cert and --registry-key go together"))
	}
	return append(errs, envflag.CheckFiles(envflag.File{Flag: "registry-ca", Path: f.CA},
		envflag.File{Flag: "registry-cert", Path: f.Cert}, envflag.File{Flag: "registry-key", Path: f.Key})...)
}

// PlaintextEndpoints returns the endpoints that are plaintext (http://, or no scheme, which the
// etcd client dials in plaintext) and whose host is not a loopback address or "localhost": the
// endpoints --registry-insecure is needed for. A caller that runs with them logs a warning.
func (f Flags) PlaintextEndpoints() []string {
	var out []string
	for _, e := range f.Endpoints() {
		host := e
		if u, err := url.Parse(e); err == nil && u.Host != "" {
			if u.Scheme == "https" {
				continue
			}
			host = u.Hostname()
		} else if h, _, err := net.SplitHostPort(e); err == nil {
			host = h
		}
		if ip, err := netip.ParseAddr(host); (err == nil && ip.IsLoopback()) || host == "localhost" {
			continue
		}
		out = append(out, e)
	}
	return out
}

// WarnInsecure logs, at warning level on log, the plaintext endpoints off loopback that
// --registry-insecure lets through; it logs nothing when there are none.
func (f Flags) WarnInsecure(log *slog.Logger) {
	if ep := f.PlaintextEndpoints(); f.Insecure && len(ep) > 0 {
		log.Warn("registry: PLAINTEXT connection to a registry off loopback (--registry-insecure): every cluster's endpoints, the partition claims and the etcd credentials cross it unencrypted",
			"endpoints", ep)
	}
}

// TLS returns the etcd client TLS configuration of the flags (registry.TLSFiles): nil, nil
// when all three are empty (plaintext), else an error naming the file that could not be used.
func (f Flags) TLS() (*tls.Config, error) {
	return registry.TLSFiles(f.Cert, f.Key, f.CA)
}
