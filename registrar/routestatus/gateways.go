package routestatus

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/gateway"
)

// resolveGateways resolves the Gateways of src (model.ResolveGateways) against mesh's services
// and returns the View to hand the gateway controller and the routes' Gateway parent statuses.
// When no Gateway is of a class aether accepts, nothing is resolved: the View has the classes
// and Gateways only, and no route has a Gateway parent of aether's. It records the Gateways'
// certificateRefs, whose Secrets' changes ask for a pass, and returns the error of a Secret it
// could not read.
func (c *Controller) resolveGateways(ctx context.Context, src *passSources, mesh *model.Mesh) (gateway.View, []model.GatewayRouteStatus, error) {
	view := gateway.View{Classes: src.classes, Gateways: src.gateways}
	if !src.aether {
		c.setSecrets(nil)
		return view, nil, nil
	}
	in := model.GatewayInputs{
		Classes: gateway.ClassNames(src.classes), Routes: src.routes, NamespaceLabels: src.namespaceLabels,
		Certificates: map[model.SecretKey]model.CertificateState{}, Services: make(map[model.ServiceKey]*model.Service, len(mesh.Services)),
		CrossNamespaceCertificates: c.CrossNamespaceCertificates, InfrastructureKeys: c.InfrastructureKeys,
	}
	for _, s := range mesh.Services {
		in.Services[s.Key] = s
	}
	for _, g := range src.grants {
		in.Grants = append(in.Grants, model.ReferenceGrantRefs(g)...)
	}
	refs := map[model.SecretKey]bool{}
	for _, g := range src.gateways {
		spec := model.GatewaySpecModel(g)
		in.Gateways = append(in.Gateways, spec)
		if in.Classes[spec.Class] != model.GatewayControllerName {
			continue
		}
		for _, l := range spec.Listeners {
			if l.TLS == nil {
				continue
			}
			for _, r := range l.TLS.CertificateRefs {
				if r.Group == "" && r.Kind == "Secret" {
					refs[r.Ref] = true
				}
			}
		}
	}
	c.setSecrets(refs)
	for _, ref := range slices.SortedFunc(maps.Keys(refs), func(a, b model.SecretKey) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	}) {
		st, ok, err := c.certificate(ctx, ref)
		if err != nil {
			return gateway.View{}, nil, err
		}
		if ok {
			in.Certificates[ref] = st
		}
	}
	var routes []model.GatewayRouteStatus
	view.Edges, view.Statuses, routes = model.ResolveGateways(in)
	return view, routes, nil
}

// setSecrets records the certificateRefs of the pass's Gateways.
func (c *Controller) setSecrets(refs map[model.SecretKey]bool) {
	c.mu.Lock()
	c.secrets = refs
	c.mu.Unlock()
}

// certificate reads the Secret of certificateRef ref and checks it (model.CheckCertificate); ok
// is false when it does not exist. The cache holds only Secrets of type kubernetes.io/tls
// (gateway.CacheByObject): one it does not hold is read from the API server (APIReader), so that
// a Secret of another type is reported as such.
func (c *Controller) certificate(ctx context.Context, ref model.SecretKey) (model.CertificateState, bool, error) {
	var s corev1.Secret
	key := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
	err := c.Client.Get(ctx, key, &s)
	if apierrors.IsNotFound(err) && c.APIReader != nil {
		err = c.APIReader.Get(ctx, key, &s)
	}
	switch {
	case apierrors.IsNotFound(err):
		return model.CertificateState{}, false, nil
	case err != nil:
		return model.CertificateState{}, false, fmt.Errorf("route status: read certificate Secret %s: %w", ref, err)
	}
	return model.CheckCertificate(string(s.Type), s.Data), true, nil
}
