package gateway

import (
	"context"
	"maps"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

func ptr[T any](v T) *T { return &v }

func testGateway(ns, name string, listeners ...gwv1.Listener) *gwv1.Gateway {
	return &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), Generation: 1},
		Spec:       gwv1.GatewaySpec{GatewayClassName: "aether", Listeners: listeners},
	}
}

func listener(name string, port int32, proto gwv1.ProtocolType) gwv1.Listener {
	return gwv1.Listener{Name: gwv1.SectionName(name), Port: gwv1.PortNumber(port), Protocol: proto}
}

// TestEdgeObjects builds the edge ServiceAccount, Deployment and Service of Gateways as data: the
// names, labels and controller owner reference to the Gateway; the Deployment's pod (one
// container, the image, the bootstrap as --config-yaml with its node id and addresses, the
// readiness probe, the capture opt-out, the ServiceAccount without a token, the hardening, one
// container port per listener port and transport, NET_BIND_SERVICE and the unprivileged-port
// sysctl only with a port below 1024); the Service's ports and externalIPs (IPAddress addresses
// only); no Service for a Gateway that opens no port.
func TestEdgeObjects(t *testing.T) {
	mixed := testGateway("shop", "web",
		listener("http", 80, gwv1.HTTPProtocolType), listener("https", 443, gwv1.HTTPSProtocolType),
		listener("passthrough", 443, gwv1.TLSProtocolType), listener("db", 5432, gwv1.TCPProtocolType),
		listener("dns", 53, gwv1.UDPProtocolType), listener("dns-tcp", 53, gwv1.TCPProtocolType),
		listener("odd", 9000, "example.com/odd"))
	mixed.Spec.Addresses = []gwv1.GatewaySpecAddress{
		{Type: ptr(gwv1.IPAddressType), Value: "192.0.2.10"}, {Value: "192.0.2.11"},
		{Type: ptr(gwv1.HostnameAddressType), Value: "gw.example.com"}, {Type: ptr(gwv1.IPAddressType), Value: "192.0.2.10"},
		{Type: ptr(gwv1.AddressType("example.com/pool")), Value: "blue"},
	}
	high := testGateway("edge", "api", listener("http", 8080, gwv1.HTTPProtocolType))
	none := testGateway("edge", "odd", listener("odd", 9000, "example.com/odd"))

	for _, c := range []struct {
		name       string
		gw         *gwv1.Gateway
		ports      []string // "<name>/<port>/<protocol>"
		bind       bool
		sysctl     string
		externalIP []string
		noService  bool
	}{
		{name: "mixed listeners", gw: mixed, ports: []string{"tcp-53/53/TCP", "udp-53/53/UDP", "tcp-80/80/TCP", "tcp-443/443/TCP", "tcp-5432/5432/TCP"},
			bind: true, sysctl: "53", externalIP: []string{"192.0.2.10", "192.0.2.11"}},
		{name: "high port only", gw: high, ports: []string{"tcp-8080/8080/TCP"}},
		{name: "no servable listener", gw: none, noService: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			gw := c.gw
			name := model.EdgeServiceAccountName(gw.Name)
			labels := map[string]string{model.LabelManagedBy: model.ManagedByAether, gwv1.GatewayNameLabelKey: gw.Name}
			checkMeta := func(kind string, m metav1.ObjectMeta) {
				t.Helper()
				if m.Namespace != gw.Namespace || m.Name != name || !equality.Semantic.DeepEqual(m.Labels, labels) {
					t.Errorf("%s: %s/%s labels %v, want %s/%s labels %v", kind, m.Namespace, m.Name, m.Labels, gw.Namespace, name, labels)
				}
				if len(m.OwnerReferences) != 1 {
					t.Fatalf("%s: owner references %+v, want the Gateway", kind, m.OwnerReferences)
				}
				o := m.OwnerReferences[0]
				if o.APIVersion != "gateway.networking.k8s.io/v1" || o.Kind != "Gateway" || o.Name != gw.Name || o.UID != gw.UID ||
					o.Controller == nil || !*o.Controller || o.BlockOwnerDeletion == nil || !*o.BlockOwnerDeletion {
					t.Errorf("%s: owner reference %+v, want the Gateway as controller", kind, o)
				}
			}

			sa := ServiceAccount(gw, nil)
			checkMeta("ServiceAccount", sa.ObjectMeta)
			if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
				t.Errorf("ServiceAccount automountServiceAccountToken %v, want false", sa.AutomountServiceAccountToken)
			}

			dep, err := Deployment(gw, "registry.example/aether-envoy:1", 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkMeta("Deployment", dep.ObjectMeta)
			if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 || !equality.Semantic.DeepEqual(dep.Spec.Selector.MatchLabels, labels) ||
				!equality.Semantic.DeepEqual(dep.Spec.Template.Labels, labels) {
				t.Errorf("Deployment replicas %v, selector %v, pod labels %v", dep.Spec.Replicas, dep.Spec.Selector, dep.Spec.Template.Labels)
			}
			if got := dep.Spec.Template.Annotations[model.AnnotationCapture]; got != "false" {
				t.Errorf("pod annotation %s %q, want \"false\"", model.AnnotationCapture, got)
			}
			pod := dep.Spec.Template.Spec
			if pod.ServiceAccountName != name || pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
				t.Errorf("pod ServiceAccount %q automount %v, want %q without a token", pod.ServiceAccountName, pod.AutomountServiceAccountToken, name)
			}
			if len(pod.Containers) != 1 || len(pod.InitContainers) != 0 {
				t.Fatalf("pod containers %d, init containers %d; want one container", len(pod.Containers), len(pod.InitContainers))
			}
			ctr := pod.Containers[0]
			if ctr.Name != "envoy" || ctr.Image != "registry.example/aether-envoy:1" || !slices.Equal(ctr.Command, []string{"envoy"}) {
				t.Errorf("container %q image %q command %v, want envoy from the image", ctr.Name, ctr.Image, ctr.Command)
			}
			i := slices.Index(ctr.Args, "--config-yaml")
			if i < 0 || i+1 >= len(ctr.Args) {
				t.Fatalf("args %v, want --config-yaml <bootstrap>", ctr.Args)
			}
			var boot bootstrapv3.Bootstrap
			if err := protojson.Unmarshal([]byte(ctr.Args[i+1]), &boot); err != nil {
				t.Fatalf("bootstrap does not parse: %v", err)
			}
			if err := boot.ValidateAll(); err != nil {
				t.Errorf("bootstrap: %v", err)
			}
			if got := boot.GetNode().GetId(); got != "edge~"+gw.Namespace+"~"+gw.Name {
				t.Errorf("bootstrap node id %q", got)
			}
			if got := boot.GetAdmin().GetAddress().GetPipe().GetPath(); got != "/var/run/aether-edge/admin.sock" {
				t.Errorf("bootstrap admin address %v, want the unix socket in the emptyDir", boot.GetAdmin().GetAddress())
			}
			xds := boot.GetStaticResources().GetClusters()[0].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
			if xds.GetAddress() != "127.0.0.1" || xds.GetPortValue() != 15010 {
				t.Errorf("bootstrap xDS address %v, want 127.0.0.1:15010", xds)
			}
			if len(boot.GetStaticResources().GetListeners()) != 1 || boot.GetStaticResources().GetListeners()[0].GetAddress().GetSocketAddress().GetPortValue() != 15090 {
				t.Errorf("bootstrap listeners %v, want the stats listener on 15090", boot.GetStaticResources().GetListeners())
			}
			p := ctr.ReadinessProbe
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/ready" || p.HTTPGet.Port.IntValue() != 15090 {
				t.Errorf("readiness probe %+v, want GET :15090/ready", p)
			}
			var ports []string
			for _, cp := range ctr.Ports {
				ports = append(ports, cp.Name+"/"+itoa(cp.ContainerPort)+"/"+string(cp.Protocol))
			}
			if !slices.Equal(ports, c.ports) {
				t.Errorf("container ports %v, want %v", ports, c.ports)
			}
			psc, sc := pod.SecurityContext, ctr.SecurityContext
			if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 ||
				psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("pod security context %+v, want non-root 65532 and seccomp RuntimeDefault", psc)
			}
			if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil ||
				*sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Fatalf("container security context %+v, want a read-only root, no escalation, ALL dropped", sc)
			}
			var add []corev1.Capability
			if c.bind {
				add = []corev1.Capability{"NET_BIND_SERVICE"}
			}
			if !slices.Equal(sc.Capabilities.Add, add) {
				t.Errorf("capabilities added %v, want %v", sc.Capabilities.Add, add)
			}
			var sysctls []corev1.Sysctl
			if c.sysctl != "" {
				sysctls = []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: c.sysctl}}
			}
			if !equality.Semantic.DeepEqual(psc.Sysctls, sysctls) {
				t.Errorf("pod sysctls %v, want %v", psc.Sysctls, sysctls)
			}
			if len(ctr.VolumeMounts) != 1 || ctr.VolumeMounts[0].MountPath != "/var/run/aether-edge" || len(pod.Volumes) != 1 || pod.Volumes[0].EmptyDir == nil {
				t.Errorf("volumes %+v mounts %+v, want one emptyDir at /var/run/aether-edge", pod.Volumes, ctr.VolumeMounts)
			}

			ips := AssignAddresses([]*gwv1.Gateway{gw}, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, nil, nil)[gatewayKey(gw)].ExternalIPs
			svc := Service(gw, ips, nil)
			if c.noService {
				if svc != nil {
					t.Errorf("Service %+v for a Gateway that opens no port, want none", svc.Spec)
				}
				return
			}
			checkMeta("Service", svc.ObjectMeta)
			if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || !equality.Semantic.DeepEqual(svc.Spec.Selector, labels) {
				t.Errorf("Service type %s selector %v, want LoadBalancer selecting the edge pods", svc.Spec.Type, svc.Spec.Selector)
			}
			var sports []string
			for _, sp := range svc.Spec.Ports {
				if sp.TargetPort.IntValue() != int(sp.Port) {
					t.Errorf("Service port %s targets %s, want %d", sp.Name, sp.TargetPort.String(), sp.Port)
				}
				sports = append(sports, sp.Name+"/"+itoa(sp.Port)+"/"+string(sp.Protocol))
			}
			if !slices.Equal(sports, c.ports) {
				t.Errorf("Service ports %v, want %v", sports, c.ports)
			}
			if !slices.Equal(svc.Spec.ExternalIPs, c.externalIP) {
				t.Errorf("Service externalIPs %v, want %v", svc.Spec.ExternalIPs, c.externalIP)
			}
		})
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// TestEdgeInfrastructure: a Gateway's spec.infrastructure labels and annotations (GEP-1867) whose
// keys the operator allows (an exact key, or a prefix ending in "/") are on every provisioned
// object and the edge pods, aether's own keys on top; others, and reserved keys
// (model.ReservedInfrastructureKey), are never taken; nothing is taken by default; the
// Deployment still selects by Labels only.
func TestEdgeInfrastructure(t *testing.T) {
	gw := testGateway("shop", "web", listener("http", 80, gwv1.HTTPProtocolType))
	gw.Spec.Infrastructure = &gwv1.GatewayInfrastructure{
		Labels: map[gwv1.LabelKey]gwv1.LabelValue{"team": "edge", "pool": "public", "aether.io/managed-by": "someone", gwv1.GatewayNameLabelKey: "other"},
		Annotations: map[gwv1.AnnotationKey]gwv1.AnnotationValue{"example.com/lb-class": "internal", "metallb.universe.tf/loadBalancerIPs": "203.0.113.9",
			"aether.io/capture": "true"},
	}
	own := Labels("web")
	for _, c := range []struct {
		name       string
		allowed    []string
		labels     map[string]string
		annotation map[string]string
	}{
		{"nothing allowed (the default)", nil, own, nil},
		{"a key and a prefix allowed", []string{"team", "example.com/", "aether.io/", gwv1.GatewayNameLabelKey},
			map[string]string{"team": "edge", model.LabelManagedBy: model.ManagedByAether, gwv1.GatewayNameLabelKey: "web"},
			map[string]string{"example.com/lb-class": "internal"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dep, err := Deployment(gw, "envoy:test", 1, c.allowed)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range []struct {
				kind string
				m    metav1.ObjectMeta
			}{{"ServiceAccount", ServiceAccount(gw, c.allowed).ObjectMeta}, {"Deployment", dep.ObjectMeta}, {"Service", Service(gw, nil, c.allowed).ObjectMeta}} {
				if !maps.Equal(o.m.Labels, c.labels) || !maps.Equal(o.m.Annotations, c.annotation) {
					t.Errorf("%s: labels %v annotations %v, want %v and %v", o.kind, o.m.Labels, o.m.Annotations, c.labels, c.annotation)
				}
			}
			pod := dep.Spec.Template.ObjectMeta
			want := map[string]string{model.AnnotationCapture: "false"}
			maps.Copy(want, c.annotation)
			if !maps.Equal(pod.Labels, c.labels) || !maps.Equal(pod.Annotations, want) {
				t.Errorf("pod template: labels %v annotations %v, want %v and %v", pod.Labels, pod.Annotations, c.labels, want)
			}
			if !maps.Equal(dep.Spec.Selector.MatchLabels, own) {
				t.Errorf("selector %v, want %v", dep.Spec.Selector.MatchLabels, own)
			}
		})
	}
}

// TestEdgeEnvoyValidates runs the real Envoy in validate mode with the edge container's
// arguments: Envoy's own parser accepts the flags and the bootstrap.
func TestEdgeEnvoyValidates(t *testing.T) {
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	dep, err := Deployment(testGateway("shop", "web", listener("http", 80, gwv1.HTTPProtocolType)), "aether-envoy:dev", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, tools.Envoy, append([]string{"--mode", "validate"}, dep.Spec.Template.Spec.Containers[0].Args...)...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("envoy --mode validate with the edge container's args: %v\n%s", err, out)
	}
}

// TestAssignAddresses decides which spec.addresses become external IPs: only addresses inside
// the allowed ranges (deny by default), never a node's InternalIP or ExternalIP, never an
// address another Service uses (cluster IPs, external IPs, load balancer ingress; the Gateway's
// own edge Service's do not count, nor the external IPs of the edge Services being decided), and
// one Gateway per address and edge port: the oldest (creationTimestamp, then namespace/name)
// keeps it. Each refusal names the field, the value and what holds it; the same inputs in
// reverse order give the same result.
func TestAssignAddresses(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC))
	allowed := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/64")}
	gw := func(key string, age int, ports []gwv1.Listener, addrs ...string) *gwv1.Gateway {
		ns, name, _ := strings.Cut(key, "/")
		g := testGateway(ns, name, ports...)
		g.CreationTimestamp = metav1.NewTime(t0.Add(time.Duration(age) * time.Second))
		for _, a := range addrs {
			g.Spec.Addresses = append(g.Spec.Addresses, gwv1.GatewaySpecAddress{Value: a})
		}
		return g
	}
	http := []gwv1.Listener{listener("http", 80, gwv1.HTTPProtocolType)}
	https := []gwv1.Listener{listener("https", 443, gwv1.HTTPSProtocolType)}
	svc := func(key string, cluster []string, external []string, lb ...string) corev1.Service {
		ns, name, _ := strings.Cut(key, "/")
		s := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{ClusterIPs: cluster, ExternalIPs: external}}
		if len(cluster) > 0 {
			s.Spec.ClusterIP = cluster[0]
		}
		for _, ip := range lb {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
		return s
	}
	edge := func(g *gwv1.Gateway, cluster string, external []string, lb ...string) corev1.Service {
		s := *Service(g, external, nil)
		s.Spec.ClusterIP, s.Spec.ClusterIPs = cluster, []string{cluster}
		for _, ip := range lb {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
		return s
	}
	node := func(name string, addrs ...corev1.NodeAddress) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: addrs}}
	}
	type want struct {
		ips     []string
		refused []string // one substring per refusal, in order
	}
	oldWeb := gw("shop/z-old", 0, http, "192.0.2.10")
	changed := gw("shop/changed", 0, http) // asked for 192.0.2.10 before: its edge Service still has it
	for _, c := range []struct {
		name     string
		allowed  []netip.Prefix
		gws      []*gwv1.Gateway
		services []corev1.Service
		nodes    []corev1.Node
		want     map[string]want
	}{
		{name: "nothing allowed", gws: []*gwv1.Gateway{gw("shop/web", 0, http, "192.0.2.10", "10.0.0.1")},
			want: map[string]want{"shop/web": {refused: []string{
				"spec.addresses[0]: value 192.0.2.10: not in the ranges the registrar may give Gateways (--gateway-address-cidrs)",
				"spec.addresses[1]: value 10.0.0.1: not in the ranges"}}}},
		{name: "inside and outside the ranges, a hostname, a repeat", allowed: allowed, gws: []*gwv1.Gateway{func() *gwv1.Gateway {
			g := gw("shop/web", 0, http, "192.0.2.10", "10.0.0.1", "192.0.2.10", "2001:db8::10")
			g.Spec.Addresses = append(g.Spec.Addresses, gwv1.GatewaySpecAddress{Type: ptr(gwv1.HostnameAddressType), Value: "gw.example.com"})
			return g
		}()}, want: map[string]want{"shop/web": {ips: []string{"192.0.2.10", "2001:db8::10"}, refused: []string{"spec.addresses[1]: value 10.0.0.1: not in the ranges"}}}},
		{name: "node addresses", allowed: allowed, gws: []*gwv1.Gateway{gw("shop/web", 0, http, "192.0.2.11", "192.0.2.12", "192.0.2.13", "192.0.2.14")},
			nodes: []corev1.Node{
				node("b", corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "192.0.2.12"}, corev1.NodeAddress{Type: corev1.NodeHostName, Address: "192.0.2.13"}),
				node("a", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.11"}),
			},
			want: map[string]want{"shop/web": {ips: []string{"192.0.2.13", "192.0.2.14"}, refused: []string{
				"spec.addresses[0]: value 192.0.2.11: the address of a Node: a node's address is never given",
				"spec.addresses[1]: value 192.0.2.12: the address of a Node: a node's address is never given"}}}},
		{name: "other Services' addresses", allowed: allowed,
			gws: []*gwv1.Gateway{gw("shop/web", 0, https, "192.0.2.1", "192.0.2.20", "192.0.2.21", "2001:db8::30", "192.0.2.22")},
			services: []corev1.Service{
				svc("default/kubernetes", []string{"192.0.2.1"}, nil),
				svc("shop/legacy", []string{"10.96.0.20"}, []string{"192.0.2.20"}),
				svc("shop/lb", []string{"10.96.0.21"}, nil, "192.0.2.21"),
				svc("shop/dual", []string{"10.96.0.30", "2001:db8::30"}, nil),
				svc("shop/headless", []string{"None"}, nil),
			},
			want: map[string]want{"shop/web": {ips: []string{"192.0.2.22"}, refused: []string{
				// Another namespace's Service is not named to the Gateway's tenant.
				"spec.addresses[0]: value 192.0.2.1: in use by a Service of another namespace",
				"spec.addresses[1]: value 192.0.2.20: in use by Service shop/legacy (spec.externalIPs)",
				"spec.addresses[2]: value 192.0.2.21: in use by Service shop/lb (status.loadBalancer.ingress)",
				"spec.addresses[3]: value 2001:db8::30: in use by Service shop/dual (spec.clusterIPs)"}}}},
		{name: "the Gateway's own edge Service", allowed: allowed, gws: []*gwv1.Gateway{oldWeb},
			services: []corev1.Service{edge(gw("shop/z-old", 0, http, "192.0.2.40", "192.0.2.41", "192.0.2.10"), "192.0.2.40", []string{"192.0.2.10"}, "192.0.2.41")},
			want:     map[string]want{"shop/z-old": {ips: []string{"192.0.2.10"}}}},
		{name: "two Gateways ask for a free address and port: the older gets it", allowed: allowed,
			gws: []*gwv1.Gateway{gw("shop/a-new", 1, http, "192.0.2.10"), oldWeb},
			want: map[string]want{"shop/z-old": {ips: []string{"192.0.2.10"}}, "shop/a-new": {refused: []string{
				"spec.addresses[0]: value 192.0.2.10: held by another Gateway (an address stays with the Gateway that has it; of the others asking, the oldest gets it when it is free): port 80/TCP by Gateway shop/z-old"}}}},
		{name: "the Gateway that has an address keeps it against an older one", allowed: allowed,
			gws: []*gwv1.Gateway{gw("shop/a-new", 1, http, "192.0.2.10"), oldWeb},
			// The newer one has it now (the older added it to its spec.addresses later): it stays.
			services: []corev1.Service{edge(gw("shop/a-new", 1, http), "10.96.0.2", []string{"192.0.2.10"})},
			want: map[string]want{"shop/a-new": {ips: []string{"192.0.2.10"}}, "shop/z-old": {refused: []string{
				"spec.addresses[0]: value 192.0.2.10: held by another Gateway (an address stays with the Gateway that has it; of the others asking, the oldest gets it when it is free): port 80/TCP by Gateway shop/a-new"}}}},
		{name: "an older Gateway with the address on another port cannot take a port it serves by adding a listener", allowed: allowed,
			gws: []*gwv1.Gateway{gw("shop/victim", 1, http, "192.0.2.10"),
				gw("shop/z-old", 0, append(slices.Clone(http), listener("alt", 81, gwv1.HTTPProtocolType)), "192.0.2.10")},
			// Both have the address now: the victim on 80, the older one on 81 (before its new
			// listener on 80).
			services: []corev1.Service{edge(gw("shop/victim", 1, http), "10.96.0.2", []string{"192.0.2.10"}),
				edge(gw("shop/z-old", 0, []gwv1.Listener{listener("alt", 81, gwv1.HTTPProtocolType)}), "10.96.0.3", []string{"192.0.2.10"})},
			want: map[string]want{"shop/victim": {ips: []string{"192.0.2.10"}}, "shop/z-old": {refused: []string{
				"port 80/TCP by Gateway shop/victim"}}}},
		{name: "a holder in another namespace is not named", allowed: allowed,
			gws:      []*gwv1.Gateway{gw("other/web", 1, http, "192.0.2.10"), oldWeb},
			services: []corev1.Service{edge(gw("other/web", 1, http), "10.96.0.2", []string{"192.0.2.10"})},
			want: map[string]want{"other/web": {ips: []string{"192.0.2.10"}}, "shop/z-old": {refused: []string{
				"port 80/TCP by a Gateway of another namespace"}}}},
		{name: "created in the same second: namespace/name decides", allowed: allowed,
			gws:  []*gwv1.Gateway{gw("b/web", 0, http, "192.0.2.10"), gw("a/web", 0, http, "192.0.2.10")},
			want: map[string]want{"a/web": {ips: []string{"192.0.2.10"}}, "b/web": {refused: []string{"port 80/TCP by a Gateway of another namespace"}}}},
		{name: "other ports share the address", allowed: allowed,
			gws: []*gwv1.Gateway{oldWeb, gw("shop/tls", 1, https, "192.0.2.10"),
				gw("shop/dns", 2, []gwv1.Listener{listener("dns", 80, gwv1.UDPProtocolType)}, "192.0.2.10"),
				gw("shop/both", 3, append(slices.Clone(https), listener("http", 80, gwv1.HTTPProtocolType)), "192.0.2.10", "192.0.2.11")},
			want: map[string]want{"shop/z-old": {ips: []string{"192.0.2.10"}}, "shop/tls": {ips: []string{"192.0.2.10"}}, "shop/dns": {ips: []string{"192.0.2.10"}},
				"shop/both": {ips: []string{"192.0.2.11"}, refused: []string{
					"spec.addresses[0]: value 192.0.2.10: held by another Gateway (an address stays with the Gateway that has it; of the others asking, the oldest gets it when it is free): port 80/TCP by Gateway shop/z-old, port 443/TCP by Gateway shop/tls"}}}},
		{name: "edge Services: external IPs being decided do not count, their cluster IPs do", allowed: allowed,
			gws:      []*gwv1.Gateway{changed, gw("shop/next", 1, http, "192.0.2.10", "192.0.2.50")},
			services: []corev1.Service{edge(changed, "192.0.2.50", []string{"192.0.2.10"})},
			want: map[string]want{"shop/changed": {}, "shop/next": {ips: []string{"192.0.2.10"}, refused: []string{
				"spec.addresses[1]: value 192.0.2.50: in use by Service shop/changed-aether-edge (spec.clusterIPs)"}}}},
		{name: "the edge Service of a Gateway that is gone still holds its address", allowed: allowed,
			gws:      []*gwv1.Gateway{gw("shop/next", 1, http, "192.0.2.10")},
			services: []corev1.Service{edge(gw("shop/gone", 0, http), "10.96.0.3", []string{"192.0.2.10"})},
			want: map[string]want{"shop/next": {refused: []string{
				"spec.addresses[0]: value 192.0.2.10: in use by Service shop/gone-aether-edge (spec.externalIPs)"}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			check := func(order string, got map[model.GatewayKey]AddressAssignment) {
				t.Helper()
				if len(got) != len(c.want) {
					t.Errorf("%s: %d assignments %v, want %d", order, len(got), got, len(c.want))
				}
				for key, w := range c.want {
					ns, name, _ := strings.Cut(key, "/")
					as, ok := got[model.GatewayKey{Namespace: ns, Name: name}]
					if !ok {
						t.Errorf("%s: no assignment for %s", order, key)
						continue
					}
					if !slices.Equal(as.ExternalIPs, w.ips) {
						t.Errorf("%s: %s external IPs %v, want %v", order, key, as.ExternalIPs, w.ips)
					}
					if len(as.Refused) != len(w.refused) {
						t.Errorf("%s: %s refused %q, want %d refusals like %q", order, key, as.Refused, len(w.refused), w.refused)
						continue
					}
					for i, r := range w.refused {
						if !strings.Contains(as.Refused[i], r) {
							t.Errorf("%s: %s refusal %d %q, want it to contain %q", order, key, i, as.Refused[i], r)
						}
					}
				}
			}
			check("given order", AssignAddresses(c.gws, c.allowed, c.services, c.nodes))
			check("reversed order", AssignAddresses(reversed(c.gws), c.allowed, reversed(c.services), reversed(c.nodes)))
		})
	}
}

func reversed[T any](s []T) []T {
	out := slices.Clone(s)
	slices.Reverse(out)
	return out
}

// TestEdgeReplicas: the edge Deployment runs the configured replicas (0 counts as 1); from two on
// its pods prefer different nodes (a node's loss takes one replica, not all).
func TestEdgeReplicas(t *testing.T) {
	gw := testGateway("shop", "web", listener("http", 80, gwv1.HTTPProtocolType))
	for _, c := range []struct {
		asked, want int32
		spread      bool
	}{{0, 1, false}, {1, 1, false}, {3, 3, true}} {
		dep, err := Deployment(gw, "envoy:test", c.asked, nil)
		if err != nil {
			t.Fatal(err)
		}
		if *dep.Spec.Replicas != c.want {
			t.Errorf("asked %d: %d replicas, want %d", c.asked, *dep.Spec.Replicas, c.want)
		}
		a := dep.Spec.Template.Spec.Affinity
		if !c.spread {
			if a != nil {
				t.Errorf("asked %d: affinity %+v, want none", c.asked, a)
			}
			continue
		}
		if a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
			t.Fatalf("asked %d: affinity %+v, want one preferred pod anti-affinity term", c.asked, a)
		}
		term := a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
		if term.TopologyKey != corev1.LabelHostname || !maps.Equal(term.LabelSelector.MatchLabels, Labels("web")) {
			t.Errorf("asked %d: anti-affinity term %+v, want the Gateway's edge pods by hostname", c.asked, term)
		}
	}
}
