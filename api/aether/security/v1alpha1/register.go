package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of aether's security API.
const GroupName = "security.aether.io"

// GroupVersion is security.aether.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource is the AuthorizationPolicy resource (authorizationpolicies) of GroupVersion, as
// discovery lists it and dynamic clients address it.
var Resource = GroupVersion.WithResource("authorizationpolicies")

// PeerAuthenticationResource is the PeerAuthentication resource (peerauthentications) of
// GroupVersion, as discovery lists it and dynamic clients address it.
var PeerAuthenticationResource = GroupVersion.WithResource("peerauthentications")

var (
	// SchemeBuilder registers the package's types.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds AuthorizationPolicy, PeerAuthentication and their lists to a scheme; it
	// returns the scheme's error.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &AuthorizationPolicy{}, &AuthorizationPolicyList{},
		&PeerAuthentication{}, &PeerAuthenticationList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
