package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/identity/spire"
)

// nodeIdentity is where the node's SVIDs come from (--identity-source, docs/identity.md): the
// node proxy's identity provider, and one per edge pod's xDS server.
type nodeIdentity struct {
	// node gives the SVIDs of the pods the node proxy serves.
	node identity.Provider
	// edge returns the provider of one edge pod's server (owner names it) and its release.
	edge func(owner string) (identity.Provider, func())
	// health is nil while the source serves (the SPIRE agent's bundle stream is up); checked as
	// readiness "identity".
	health func(context.Context) error
}

// startIdentity starts cfg's identity source: the development CA of --ca-cert and --ca-key
// (each provider renews its SVIDs at half-life), or the node's SPIRE agent through its Delegated
// Identity API on --spire-admin-socket, asked by each pod's selectors (identity/spire) and kept
// subscribed until ctx ends.
func startIdentity(ctx context.Context, cfg Config, log *slog.Logger) (*nodeIdentity, error) {
	switch cfg.IdentitySource {
	case IdentityDevCA:
		ca, err := identity.LoadDevCA(cfg.CACert, cfg.CAKey, cfg.TrustDomain, cfg.SVIDTTL)
		if err != nil {
			return nil, fmt.Errorf("--ca-cert/--ca-key: %w", err)
		}
		return &nodeIdentity{
			node: identity.NewRotator(ca).Provider(),
			edge: func(string) (identity.Provider, func()) {
				return identity.NewRotator(ca).Provider(), func() {}
			},
			health: func(context.Context) error { return nil },
		}, nil
	case IdentitySPIRE:
		d, err := spire.New(spire.Config{AdminSocket: cfg.SPIREAdminSocket, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("--spire-admin-socket: %w", err)
		}
		d.Start(ctx)
		node := spire.NewProvider(d, cfg.TrustDomain, "node")
		// A restarted agent's first snapshot waits (up to 5 s) for the SVIDs of the pods it
		// already had: without them it would take their listeners out of the running Envoy.
		node.SettleFirst(5 * time.Second)
		return &nodeIdentity{
			node: node,
			edge: func(owner string) (identity.Provider, func()) {
				p := spire.NewProvider(d, cfg.TrustDomain, owner)
				return p, p.Close
			},
			health: func(context.Context) error {
				b, err := d.Bundles()
				switch {
				case err != nil:
					return fmt.Errorf("SPIRE agent at %s: %w (the SVIDs held are served until they expire)", cfg.SPIREAdminSocket, err)
				case len(b[cfg.TrustDomain]) == 0:
					return fmt.Errorf("SPIRE agent at %s: no trust bundle of trust domain %q yet", cfg.SPIREAdminSocket, cfg.TrustDomain)
				}
				return nil
			},
		}, nil
	}
	return nil, errors.New("--identity-source " + cfg.IdentitySource + ": want spire or dev-ca")
}
