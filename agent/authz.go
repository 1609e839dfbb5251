package agent

import (
	"github.com/aethermesh/aether/internal/authzsource"
	"github.com/aethermesh/aether/model"
)

// authzPolicies fills the model's sources with the cluster's AuthorizationPolicies
// (model.Sources.AuthorizationPolicies, every namespace), watched once their CRD is installed
// (authzsource.Source; docs/authorization.md): a change re-assembles the model, so the node's
// Envoy gets each policy's RBAC in the next snapshot.
type authzPolicies struct{ *authzsource.Source }

// Fill sets s.AuthorizationPolicies: every watched policy sorted by namespace and name (shared
// objects: callers must not change them), none while the CRD is not installed.
func (a authzPolicies) Fill(s *model.Sources) error {
	s.AuthorizationPolicies = a.Policies()
	return nil
}
