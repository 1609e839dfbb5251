package agent

import (
	"fmt"

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
// objects: callers must not change them), none while the CRD is not installed. While it is not
// known whether the CRD is installed (discovery failing) or its watch has not synced, it returns
// an error: the assembler keeps the last model, never one without the policies it had.
func (a authzPolicies) Fill(s *model.Sources) error {
	if !a.Known() {
		return errPoliciesUnknown("AuthorizationPolicies")
	}
	s.AuthorizationPolicies = a.Policies()
	return nil
}

// errPoliciesUnknown is Fill's error while a policy source is not known (policysource.Known).
func errPoliciesUnknown(kind string) error {
	return fmt.Errorf("%s not known yet (CRD discovery failing, or its watch not synced): keeping the last model", kind)
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
// the CRD is not installed; an error while not known, as authzPolicies.Fill.
func (a peerAuthns) Fill(s *model.Sources) error {
	if !a.Known() {
		return errPoliciesUnknown("PeerAuthentications")
	}
	s.PeerAuthns = model.ConvertPeerAuthns(a.Policies())
	return nil
}
