package agent

import (
	"github.com/aethermesh/aether/internal/policysource"
	"github.com/aethermesh/aether/model"
)

// authzPolicies fills the model's sources with the cluster's AuthorizationPolicies
// (model.Sources.AuthorizationPolicies, every namespace), watched once their CRD is installed
// (policysource.AuthorizationPolicies; docs/authorization.md): a change re-assembles the model,
// so the node's Envoy gets each policy's RBAC in the next snapshot.
type authzPolicies struct {
	*policysource.AuthorizationPolicies
}

// Fill sets s.AuthorizationPolicies: every watched policy sorted by namespace and name (shared
// objects: callers must not change them), none while the CRD is not installed.
func (a authzPolicies) Fill(s *model.Sources) error {
	s.AuthorizationPolicies = a.Policies()
	return nil
}

// peerAuthns fills the model's sources with the cluster's PeerAuthentications
// (model.Sources.PeerAuthns, every namespace), watched once their CRD is installed
// (policysource.PeerAuthentications; docs/authorization.md): a change re-assembles the model,
// so every local pod's inbound mTLS mode (Mesh.Inbound) reaches its capture rules (inboundSync).
type peerAuthns struct {
	*policysource.PeerAuthentications
}

// Fill sets s.PeerAuthns: every watched policy converted (model.ConvertPeerAuthns: an invalid
// one as what applies instead of it, never more open), sorted by namespace and name; none while
// the CRD is not installed.
func (a peerAuthns) Fill(s *model.Sources) error {
	s.PeerAuthns = model.ConvertPeerAuthns(a.Policies())
	return nil
}
