package gateway

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aethermesh/aether/envoy"
	"github.com/aethermesh/aether/model"
)

// The edge pod's fixed addresses (docs/gateway.md, "The edge data plane").
const (
	// EdgeXDSAddress is where the edge Envoy finds its xDS server: the node agent of the node the
	// pod runs on serves it on this address inside the pod's network namespace.
	EdgeXDSAddress = "127.0.0.1:15010"
	// EdgeAdminDir is the edge container's emptyDir for Envoy's admin socket, EdgeAdminAddress.
	EdgeAdminDir     = "/var/run/aether-edge"
	EdgeAdminAddress = "unix://" + EdgeAdminDir + "/admin.sock"
	// EdgeStatsPort is Envoy's metrics-only listener (envoy.BootstrapConfig.StatsAddress), which
	// also answers the readiness probe's GET /ready.
	EdgeStatsPort = 15090
	// EdgeUser is the uid and gid the edge Envoy runs as (no root: it only serves listeners).
	EdgeUser = 65532
	// EdgeContainer is the name of the edge pod's only container.
	EdgeContainer = "envoy"
	// unprivilegedPortsSysctl lowers the first port a process without CAP_NET_BIND_SERVICE may
	// bind in the pod's network namespace (a namespaced, "safe" sysctl since Kubernetes 1.22).
	unprivilegedPortsSysctl = "net.ipv4.ip_unprivileged_port_start"
)

// EdgeNodeID is the node.id of the edge Envoy of Gateway ns/name: "edge~<ns>~<name>"; the node
// agent serves that Gateway's EdgeGateway to it.
func EdgeNodeID(ns, name string) string { return "edge~" + ns + "~" + name }

// NameProblem says why Gateway name cannot be given an edge data plane ("" when it can): the
// edge objects' name, model.EdgeServiceAccountName(name), must be a DNS-1035 label (a Service's
// name) and name a label value (the gateway-name label), so a Gateway name with a dot, or longer
// than 51 characters, is refused.
func NameProblem(name string) string {
	edge := model.EdgeServiceAccountName(name)
	if errs := validation.IsDNS1035Label(edge); len(errs) > 0 {
		return fmt.Sprintf("metadata.name %q: the edge Service name %q is not a DNS-1035 label (%s); aether needs Gateway names of at most %d characters of lower case letters, digits and '-', starting with a letter",
			name, edge, strings.Join(errs, "; "), validation.DNS1035LabelMaxLength-len(edge)+len(name))
	}
	return ""
}

// Labels are the labels of every object provisioned for Gateway name (and of its edge pods):
// aether.io/managed-by: aether and gateway.networking.k8s.io/gateway-name: <name>.
func Labels(name string) map[string]string {
	return map[string]string{model.LabelManagedBy: model.ManagedByAether, gwv1.GatewayNameLabelKey: name}
}

// owner is the controller owner reference to gw that every provisioned object carries: the
// garbage collector removes them with the Gateway.
func owner(gw *gwv1.Gateway) []metav1.OwnerReference {
	yes := true
	return []metav1.OwnerReference{{
		APIVersion: gwv1.GroupVersion.String(), Kind: "Gateway", Name: gw.Name, UID: gw.UID,
		Controller: &yes, BlockOwnerDeletion: &yes,
	}}
}

// objectMeta is the metadata of gw's provisioned objects: gw's spec.infrastructure labels and
// annotations (GEP-1867) with Labels on top, the controller owner reference.
func objectMeta(gw *gwv1.Gateway, allowed []string) metav1.ObjectMeta {
	labels, annotations := infrastructure(gw, allowed, Labels(gw.Name), nil)
	return metav1.ObjectMeta{Namespace: gw.Namespace, Name: model.EdgeServiceAccountName(gw.Name),
		Labels: labels, Annotations: annotations, OwnerReferences: owner(gw)}
}

// infrastructure returns gw's spec.infrastructure labels and annotations (GEP-1867: for every
// object created for the Gateway) whose keys the operator allows (model.InfrastructureKeyAllowed,
// --gateway-infrastructure-keys; none by default), with aether's own, labels and annotations, on
// top; a reserved key is never taken (the model does not accept a Gateway asking for one). Nil
// maps for none.
func infrastructure(gw *gwv1.Gateway, allowed []string, labels, annotations map[string]string) (map[string]string, map[string]string) {
	merge := func(from map[string]string, own map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range from {
			if model.InfrastructureKeyAllowed(allowed, k) {
				out[k] = v
			}
		}
		maps.Copy(out, own)
		if len(out) == 0 {
			return nil
		}
		return out
	}
	var il, ia map[string]string
	if inf := gw.Spec.Infrastructure; inf != nil {
		il, ia = map[string]string{}, map[string]string{}
		for k, v := range inf.Labels {
			il[string(k)] = string(v)
		}
		for k, v := range inf.Annotations {
			ia[string(k)] = string(v)
		}
	}
	return merge(il, labels), merge(ia, annotations)
}

// EdgePort is one port the edge Envoy listens on: a listener port and its transport.
type EdgePort struct {
	Port     int32
	Protocol corev1.Protocol
}

// Name is the port's name in the container and the Service: "tcp-<port>" or "udp-<port>".
func (p EdgePort) Name() string {
	if p.Protocol == corev1.ProtocolUDP {
		return "udp-" + strconv.Itoa(int(p.Port))
	}
	return "tcp-" + strconv.Itoa(int(p.Port))
}

// Ports are the distinct (port, transport) pairs of gw's listeners, sorted: UDP for protocol UDP,
// TCP for HTTP, HTTPS, TLS and TCP. A listener of any other protocol opens no port (the Gateway's
// status reports it, model.ResolveGateways).
func Ports(gw *gwv1.Gateway) []EdgePort {
	var out []EdgePort
	for _, l := range gw.Spec.Listeners {
		p := EdgePort{Port: int32(l.Port), Protocol: corev1.ProtocolTCP}
		switch model.ListenerProtocol(l.Protocol) {
		case model.ListenerHTTP, model.ListenerHTTPS, model.ListenerTLS, model.ListenerTCP:
		case model.ListenerUDP:
			p.Protocol = corev1.ProtocolUDP
		default:
			continue
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b EdgePort) int {
		return cmp.Or(cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
	})
	return out
}

// ServiceAccount is the edge pods' ServiceAccount, <gw>-aether-edge (model.EdgeServiceAccountName):
// their workload identity, whose token is not mounted (the edge Envoy calls no API). It carries
// gw's spec.infrastructure labels and annotations whose keys infra allows (objectMeta).
func ServiceAccount(gw *gwv1.Gateway, infra []string) *corev1.ServiceAccount {
	no := false
	return &corev1.ServiceAccount{
		TypeMeta:                     metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta:                   objectMeta(gw, infra),
		AutomountServiceAccountToken: &no,
	}
}

// Deployment is the edge Deployment of gw, <gw>-aether-edge: replicas (at least 1; from two on,
// spread over nodes, spread) of a pod with one container, EdgeContainer, running Envoy from image with the bootstrap of EdgeBootstrap passed as
// --config-yaml (JSON is YAML). The Deployment and its pods carry the Gateway's
// spec.infrastructure labels and annotations (objectMeta); the selector is Labels only. The pod opts out of capture (aether.io/capture: "false"), runs as
// the ServiceAccount of ServiceAccount and as EdgeUser, hardened as the chart's other pods
// (seccomp RuntimeDefault, a read-only root filesystem, every capability dropped,
// no privilege escalation); its only writable path is the emptyDir EdgeAdminDir. When a listener
// port is below 1024, the container adds NET_BIND_SERVICE and the pod sets the namespaced sysctl
// net.ipv4.ip_unprivileged_port_start to the lowest such port: container runtimes give a non-root
// process no added capability (they set no ambient capabilities), so the sysctl is what lets
// Envoy bind it. The readiness probe is GET /ready on EdgeStatsPort. It returns Bootstrap's error.
func Deployment(gw *gwv1.Gateway, image string, replicas int32, infra []string) (*appsv1.Deployment, error) {
	boot, err := EdgeBootstrap(gw.Namespace, gw.Name)
	if err != nil {
		return nil, fmt.Errorf("edge Deployment of Gateway %s/%s: %w", gw.Namespace, gw.Name, err)
	}
	ports := Ports(gw)
	var cports []corev1.ContainerPort
	low := int32(0)
	for _, p := range ports {
		cports = append(cports, corev1.ContainerPort{Name: p.Name(), ContainerPort: p.Port, Protocol: p.Protocol})
		if p.Port < 1024 && (low == 0 || p.Port < low) {
			low = p.Port
		}
	}
	yes, no := true, false
	uid := int64(EdgeUser)
	caps := &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}
	psc := &corev1.PodSecurityContext{
		RunAsNonRoot: &yes, RunAsUser: &uid, RunAsGroup: &uid,
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if low > 0 {
		caps.Add = []corev1.Capability{"NET_BIND_SERVICE"}
		psc.Sysctls = []corev1.Sysctl{{Name: unprivilegedPortsSysctl, Value: strconv.Itoa(int(low))}}
	}
	replicas = max(replicas, 1)
	meta := objectMeta(gw, infra)
	var podMeta metav1.ObjectMeta
	podMeta.Labels, podMeta.Annotations = infrastructure(gw, infra, Labels(gw.Name), map[string]string{model.AnnotationCapture: "false"})
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: meta,
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: Labels(gw.Name)},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: podMeta,
				Spec: corev1.PodSpec{
					Affinity:                     spread(gw.Name, replicas),
					ServiceAccountName:           meta.Name,
					AutomountServiceAccountToken: &no,
					SecurityContext:              psc,
					Containers: []corev1.Container{{
						Name:    EdgeContainer,
						Image:   image,
						Command: []string{"envoy"},
						Args:    []string{"--config-yaml", string(boot), "--disable-hot-restart", "--log-level", "info"},
						Ports:   cports,
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
							Path: "/ready", Port: intstr.FromInt32(EdgeStatsPort)}}, PeriodSeconds: 5},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes, Capabilities: caps,
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "admin", MountPath: EdgeAdminDir}},
					}},
					Volumes: []corev1.Volume{{Name: "admin", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				},
			},
		},
	}, nil
}

// spread is the edge pods' affinity with replicas of them: none for one; for more, a preferred
// pod anti-affinity on kubernetes.io/hostname against the Gateway's other edge pods, so a node's
// loss takes one replica, not all (preferred: a cluster with fewer nodes still runs them all).
func spread(gateway string, replicas int32) *corev1.Affinity {
	if replicas < 2 {
		return nil
	}
	return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 100, PodAffinityTerm: corev1.PodAffinityTerm{
			LabelSelector: &metav1.LabelSelector{MatchLabels: Labels(gateway)}, TopologyKey: corev1.LabelHostname}}},
	}}
}

// EdgeBootstrap is the edge Envoy's bootstrap (JSON) for Gateway ns/name: node id EdgeNodeID, xDS
// from EdgeXDSAddress, the admin API on EdgeAdminAddress and the metrics listener on
// EdgeStatsPort (envoy.Bootstrap).
func EdgeBootstrap(ns, name string) ([]byte, error) {
	return envoy.Bootstrap(envoy.BootstrapConfig{
		NodeID: EdgeNodeID(ns, name), XDSAddress: EdgeXDSAddress, AdminAddress: EdgeAdminAddress,
		StatsAddress: "0.0.0.0:" + strconv.Itoa(EdgeStatsPort),
	})
}

// Service is the edge Service of gw, <gw>-aether-edge: type LoadBalancer, selecting the edge
// pods, one port per EdgePort (target port the same number), and spec.externalIPs externalIPs
// (what AssignAddresses gave the Gateway of its spec.addresses): how a cluster without a load
// balancer controller reaches the Gateway at an address routed to its nodes. It is nil when gw
// opens no port (a Service needs one). Like the other edge objects it carries gw's
// spec.infrastructure labels and annotations whose keys infra allows (objectMeta).
func Service(gw *gwv1.Gateway, externalIPs, infra []string) *corev1.Service {
	ports := Ports(gw)
	if len(ports) == 0 {
		return nil
	}
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: objectMeta(gw, infra),
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: Labels(gw.Name)},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.Name(), Port: p.Port, Protocol: p.Protocol, TargetPort: intstr.FromInt32(p.Port)})
	}
	svc.Spec.ExternalIPs = slices.Clone(externalIPs)
	return svc
}

// CertificateCopy is the published copy of certificateRef ref in namespace ns (the registrar's):
// Secret model.EdgeCertificateSecretName(ref) of type kubernetes.io/tls holding src's tls.crt
// and tls.key, labelled aether.io/managed-by: aether and model.LabelEdgeCertificate "true",
// annotated model.AnnotationCertificateRef "<namespace>/<name>".
func CertificateCopy(ns string, ref model.SecretKey, src *corev1.Secret) *corev1.Secret {
	return &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: model.EdgeCertificateSecretName(ref),
			Labels:      map[string]string{model.LabelManagedBy: model.ManagedByAether, model.LabelEdgeCertificate: "true"},
			Annotations: map[string]string{model.AnnotationCertificateRef: ref.String()}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: src.Data[corev1.TLSCertKey], corev1.TLSPrivateKeyKey: src.Data[corev1.TLSPrivateKeyKey]},
	}
}
