package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// UserError says the registry has etcd authentication on and this writer is not authenticated as
// its cluster's own user (UserName): it has no credentials, or another cluster's, or root's. A
// writer with a shared or root identity could write every cluster's partition, which per-cluster
// users exist to prevent (SetupAuth), so it writes nothing (Config.AllowForeignUser overrides).
type UserError struct {
	Origin Origin
	// User is the identity the writer presents: Config.Username, else its client certificate's
	// CN ("" when neither).
	User string
}

// Error implements error.
func (e *UserError) Error() string {
	want := UserName(e.Origin)
	if e.User == "" {
		return fmt.Sprintf("registry has etcd authentication on, but this writer has no etcd user: authenticate as %q (a client certificate with that CN, or --registry-user with AETHER_REGISTRY_PASSWORD; `aether-registrar setup-registry-auth` creates it)", want)
	}
	return fmt.Sprintf("registry has etcd authentication on and this writer is etcd user %q, not its cluster's own %q: a shared or root user could write other clusters' partitions; use %q (or --registry-insecure to allow it)", e.User, want, want)
}

// presentedUser is the etcd user a client presents: username, else the CN of cfg's client
// certificate (etcd --client-cert-auth takes the user from it; etcd's transport.TLSInfo serves it
// through GetClientCertificate, which reads the files), else "".
func presentedUser(username string, cfg *tls.Config) string {
	if username != "" {
		return username
	}
	if cfg == nil {
		return ""
	}
	var cert *tls.Certificate
	switch {
	case len(cfg.Certificates) > 0:
		cert = &cfg.Certificates[0]
	case cfg.GetClientCertificate != nil:
		c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil {
			return ""
		}
		cert = c
	}
	if cert == nil || len(cert.Certificate) == 0 {
		return ""
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return ""
		}
	}
	return leaf.Subject.CommonName
}

// checkUser checks, with each claim check until authentication is found on, that with etcd
// authentication on this writer is its cluster's own user (UserError otherwise). An etcd error is
// returned and not remembered (the next check asks again); a finding with authentication on is
// remembered. With authentication off it logs, once, that any client of the registry can write
// every partition, and asks again at the next check.
func (r *Registry) checkUser(ctx context.Context) error {
	r.umu.Lock()
	defer r.umu.Unlock()
	if r.userChecked {
		return r.userErr
	}
	// AuthStatus answers anyone while authentication is off, and only root once it is on: a
	// refusal says authentication is on and this writer is not root.
	authOn := true
	st, err := r.cli.AuthStatus(ctx)
	switch {
	case err == nil:
		authOn = st.Enabled
	case errors.Is(err, rpctypes.ErrPermissionDenied), errors.Is(err, rpctypes.ErrUserEmpty):
	default:
		return fmt.Errorf("check registry identity: %w", err)
	}
	switch {
	case !authOn:
		// Not remembered: authentication may be turned on later (setup-registry-auth), and the
		// next check must then judge the user.
		if !r.warnedAuthOff {
			r.warnedAuthOff = true
			r.log.Warn("registry: etcd authentication is off: any client of the registry can write every cluster's partition (`aether-registrar setup-registry-auth` turns it on)")
		}
		return nil
	case r.user == UserName(r.origin):
	case r.allowForeignUser:
		r.log.Warn("registry: writing as an etcd user that is not this cluster's own (allowed by --registry-insecure)", "user", r.user, "want", UserName(r.origin))
	default:
		r.userErr = &UserError{Origin: r.origin, User: r.user}
		r.log.Error("registry: writing nothing", "err", r.userErr)
	}
	r.userChecked = true
	return r.userErr
}
