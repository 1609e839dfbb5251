package gateway

import (
	"context"
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

			sa := ServiceAccount(gw)
			checkMeta("ServiceAccount", sa.ObjectMeta)
			if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
				t.Errorf("ServiceAccount automountServiceAccountToken %v, want false", sa.AutomountServiceAccountToken)
			}

			dep, err := Deployment(gw, "registry.example/aether-envoy:1")
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

			svc := Service(gw, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")})
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

// TestEdgeEnvoyValidates runs the real Envoy in validate mode with the edge container's
// arguments: Envoy's own parser accepts the flags and the bootstrap.
func TestEdgeEnvoyValidates(t *testing.T) {
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	dep, err := Deployment(testGateway("shop", "web", listener("http", 80, gwv1.HTTPProtocolType)), "aether-envoy:dev")
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

// TestExternalIPs: only addresses inside the allowed ranges become the edge Service's external
// IPs (deny by default: an external IP takes traffic for that address on every node); the others
// are refused, named by field and value; hostnames and other types are left to the resolver.
func TestExternalIPs(t *testing.T) {
	gw := testGateway("shop", "web", listener("http", 80, gwv1.HTTPProtocolType))
	gw.Spec.Addresses = []gwv1.GatewaySpecAddress{
		{Value: "192.0.2.10"}, {Type: ptr(gwv1.IPAddressType), Value: "10.0.0.1"},
		{Type: ptr(gwv1.HostnameAddressType), Value: "gw.example.com"}, {Value: "192.0.2.10"},
	}
	for _, c := range []struct {
		name         string
		allowed      []netip.Prefix
		ips, refused []string
	}{
		{"none allowed", nil, nil, []string{"spec.addresses[0]: value 192.0.2.10", "spec.addresses[1]: value 10.0.0.1", "spec.addresses[3]: value 192.0.2.10"}},
		{"one range", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, []string{"192.0.2.10"}, []string{"spec.addresses[1]: value 10.0.0.1"}},
		{"both", []netip.Prefix{netip.MustParsePrefix("192.0.2.10/32"), netip.MustParsePrefix("10.0.0.0/8")}, []string{"192.0.2.10", "10.0.0.1"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ips, refused := ExternalIPs(gw, c.allowed)
			if !slices.Equal(ips, c.ips) || !slices.Equal(refused, c.refused) {
				t.Errorf("ExternalIPs = %v refused %v, want %v refused %v", ips, refused, c.ips, c.refused)
			}
			if svc := Service(gw, c.allowed); !slices.Equal(svc.Spec.ExternalIPs, c.ips) {
				t.Errorf("Service externalIPs %v, want %v", svc.Spec.ExternalIPs, c.ips)
			}
		})
	}
}
