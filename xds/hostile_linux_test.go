package xds

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/model"
)

// TestPrivilegedHostileServicesAcked: a real Envoy ACKs the snapshot of a model assembled from
// Kubernetes objects that pass API validation but carry odd ports (a Service with 80/TCP and
// 80/SCTP, a ServiceImport listing port 80 twice and ports 0, 70000 and -1, which its CRD does
// not bound), and the well-formed service beside them is still routed. Before, two ports with
// the same number gave the lane route table two virtual hosts with the same domains, Envoy
// rejected it, and every later snapshot (every pod ADD on the node) failed with it.
func TestPrivilegedHostileServicesAcked(t *testing.T) {
	f := newMeshFixture(t, time.Hour, true, Options{})
	_, ip := f.addPod("client", false)
	svc := func(name string, ports ...corev1.ServicePort) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
			Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0." + string(rune('0'+len(name)))}, Ports: ports}}
	}
	in := model.Sources{
		Cluster: "c1", MeshDomain: "mesh", TrustDomain: f.td, MeshNamespaces: map[string]bool{"shop": true},
		Services: []*corev1.Service{
			svc("web", corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}),
			svc("dual", corev1.ServicePort{Name: "tcp", Port: 80, Protocol: corev1.ProtocolTCP},
				corev1.ServicePort{Name: "sctp", Port: 80, Protocol: corev1.ProtocolSCTP}),
		},
		Imports: []*mcsv1beta1.ServiceImport{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api"},
			Spec: mcsv1beta1.ServiceImportSpec{IPs: []string{"10.97.0.5"}, Ports: []mcsv1beta1.ServicePort{
				{Name: "a", Port: 80}, {Name: "b", Port: 80}, {Name: "zero", Port: 0}, {Name: "big", Port: 70000}, {Name: "neg", Port: -1}}}}},
		Pods: []*corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "client", UID: "uid-client"}}},
		Attachments: map[string]cniv1.PodAttachment{"uid-client": {PodUID: "uid-client", Namespace: "shop", Name: "client",
			NetnsPath: f.pods["client"].Path, IPs: []netip.Addr{ip}}},
	}
	f.set(model.Assemble(2, in))
	rt, err := f.admin("/config_dump?resource=dynamic_route_configs")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"web.shop.mesh:80", "dual.shop.mesh:80", "api.shop.svc.clusterset.local:80"} {
		if !strings.Contains(rt, want) {
			t.Errorf("Envoy's route tables lack %q", want)
		}
	}
	if n, last := f.srv.NACKs(); n != 0 {
		t.Errorf("Envoy rejected %d responses, last: %s", n, last)
	}
}

// TestPrivilegedLongImportNameAcked: with the east-west waypoint on, a ServiceImport whose name
// is a valid object name but no DNS label (253 characters with dots; MCS names a ServiceImport
// after its Service, a label) is left out of the model, and a real Envoy ACKs the snapshot with
// the well-formed service beside it. Before, its waypoint SNI ("<port>.<name>.<ns>.<meshDomain>",
// 264 bytes) passed ValidateAll (the TLS context is inside an Any) and Envoy rejected the
// clusters (UpstreamTlsContext.sni is at most 255 bytes), so no snapshot after it was ACKed.
func TestPrivilegedLongImportNameAcked(t *testing.T) {
	f := newMeshFixture(t, time.Hour, true, Options{EastWestWaypoint: true})
	_, ip := f.addPod("client", false)
	long := strings.Repeat("a.", 126) + "b"
	in := model.Sources{
		Cluster: "c1", MeshDomain: "mesh", TrustDomain: f.td, MeshNamespaces: map[string]bool{"shop": true},
		Services: []*corev1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
			Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.1"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}},
		Imports: []*mcsv1beta1.ServiceImport{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: long},
			Spec: mcsv1beta1.ServiceImportSpec{IPs: []string{"10.97.0.5"}, Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80}}}}},
		Pods: []*corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "client", UID: "uid-client"}}},
		Attachments: map[string]cniv1.PodAttachment{"uid-client": {PodUID: "uid-client", Namespace: "shop", Name: "client",
			NetnsPath: f.pods["client"].Path, IPs: []netip.Addr{ip}}},
	}
	m := model.Assemble(2, in)
	v, err := f.srv.SetMesh(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// WaitForAck returns once listeners and clusters are ACKed, or at the NACK.
	if err := f.srv.WaitForAck(ctx, v); err != nil {
		t.Fatalf("WaitForAck: %v", err)
	}
	if n, last := f.srv.NACKs(); n != 0 {
		t.Errorf("Envoy rejected %d responses, last: %s", n, last)
	}
	if m.Service(model.ServiceKey{Namespace: "shop", Name: long}) != nil || len(m.Skipped()) != 1 {
		t.Errorf("the import is in the model (skipped: %v)", m.Skipped())
	}
}
