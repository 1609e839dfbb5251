package model

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// EdgePod is a pod on this node that serves an edge Gateway: the agent serves that Gateway's
// configuration (and the edge's SVID) to it over an ADS listener inside NetnsPath.
type EdgePod struct {
	UID, Namespace, Name string
	NetnsPath            string
	Gateway              GatewayKey
	// SPIFFEID is the edge's identity: its ServiceAccount's SPIFFE ID.
	SPIFFEID string
}

// Gateway returns the edge Gateway k, or nil.
func (m *Mesh) Gateway(k GatewayKey) *EdgeGateway {
	i, ok := slices.BinarySearchFunc(m.Gateways, k, func(g *EdgeGateway, k GatewayKey) int {
		if c := strings.Compare(g.Key.Namespace, k.Namespace); c != 0 {
			return c
		}
		return strings.Compare(g.Key.Name, k.Name)
	})
	if !ok {
		return nil
	}
	return m.Gateways[i]
}

// assembleEdges resolves the edge Gateways of in (ResolveGateways, against m's services and the
// mesh routes routes plus the L4 routes) into m.Gateways, and finds this node's edge pods: a pod
// in a Gateway's namespace that runs as the Gateway's edge ServiceAccount, is not on the host
// network and has a CNI attachment with a netns path (uncaptured, as the provisioned
// Deployment's pods are, or captured). The ServiceAccount is what the agent
// trusts, as Kubernetes does: whoever may run pods as it in that namespace may serve the
// Gateway (docs/gateway.md, "Security").
func assembleEdges(m *Mesh, in Sources, routes []Route) {
	e := in.Edge
	if len(e.Gateways) == 0 {
		return
	}
	gin := GatewayInputs{
		Classes:         map[string]string{},
		NamespaceLabels: e.NamespaceLabels,
		Certificates:    map[SecretKey]CertificateState{},
		Services:        m.byKey,

		CrossNamespaceCertificates: e.CrossNamespaceCertificates,
	}
	for _, c := range e.GatewayClasses {
		gin.Classes[c.Name] = string(c.Spec.ControllerName)
	}
	for _, g := range e.Gateways {
		gin.Gateways = append(gin.Gateways, GatewaySpecModel(g))
	}
	for _, g := range e.ReferenceGrants {
		gin.Grants = append(gin.Grants, ReferenceGrantRefs(g)...)
	}
	gin.Routes = slices.Clone(routes)
	for _, r := range e.TCPRoutes {
		gin.Routes = append(gin.Routes, TCPRouteModel(r))
	}
	for _, r := range e.TLSRoutes {
		gin.Routes = append(gin.Routes, TLSRouteModel(r))
	}
	for _, r := range e.UDPRoutes {
		gin.Routes = append(gin.Routes, UDPRouteModel(r))
	}
	for _, s := range e.Certificates {
		ns, name, ok := strings.Cut(s.Annotations[AnnotationCertificateRef], "/")
		if !ok || s.Labels[LabelEdgeCertificate] != "true" {
			continue
		}
		ref := SecretKey{Namespace: ns, Name: name}
		st := CheckCertificate(string(s.Type), s.Data)
		if st.Problem == "" {
			st.Certificate.Ref = ref
			st.Certificate.CertPEM, st.Certificate.KeyPEM = s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
		}
		gin.Certificates[ref] = st
	}
	gws, _, _ := ResolveGateways(gin)
	slices.SortFunc(gws, func(a, b *EdgeGateway) int {
		if c := strings.Compare(a.Key.Namespace, b.Key.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Key.Name, b.Key.Name)
	})
	for _, g := range gws {
		if g.ServiceAccount == "" {
			g.ServiceAccount = EdgeServiceAccountName(g.Key.Name)
		}
	}
	m.Gateways = gws
	for _, p := range in.Pods {
		if p.Spec.HostNetwork || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		att, ok := in.Uncaptured[string(p.UID)]
		if !ok {
			att, ok = in.Attachments[string(p.UID)]
		}
		if !ok || att.NetnsPath == "" {
			continue
		}
		for _, g := range gws {
			if g.Key.Namespace == p.Namespace && g.ServiceAccount == p.Spec.ServiceAccountName {
				m.EdgePods = append(m.EdgePods, EdgePod{UID: string(p.UID), Namespace: p.Namespace, Name: p.Name, NetnsPath: att.NetnsPath,
					Gateway: g.Key, SPIFFEID: SPIFFEID(m.TrustDomain, p.Namespace, p.Spec.ServiceAccountName)})
				break
			}
		}
	}
	slices.SortFunc(m.EdgePods, func(a, b EdgePod) int { return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
}
