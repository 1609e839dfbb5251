package mcs

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

func mark(cluster, created string, ports ...uint32) Mark {
	o := registry.Origin{Region: "r1", Cluster: cluster}
	m := &registryv1.ExportMark{Service: &registryv1.ServiceRef{Namespace: "ns", Name: "svc"}, ClusterName: cluster, Region: "r1", CreateTime: created}
	for _, p := range ports {
		m.Ports = append(m.Ports, &registryv1.ServicePort{Name: "p" + string(rune('a'+p%26)), Port: p, Protocol: registryv1.Protocol_PROTOCOL_HTTP})
	}
	return Mark{Key: o.ExportKey("ns", "svc"), Origin: o, Value: m}
}

func TestResolve(t *testing.T) {
	const t1, t2 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z"
	for _, tc := range []struct {
		name          string
		marks         []Mark
		winner        string
		conflicts     []string
		clusters      string
		wantConflicts int
	}{
		{name: "one export", marks: []Mark{mark("a", t1, 80)}, winner: "a", clusters: "a"},
		{name: "compatible exports", marks: []Mark{mark("b", t1, 80), mark("a", t2, 80)}, winner: "b", clusters: "a,b"},
		{name: "oldest wins over name order", marks: []Mark{mark("z", t1, 80), mark("a", t2, 8080)}, winner: "z", conflicts: []string{"a"}, clusters: "a,z"},
		{name: "same time: cluster name decides", marks: []Mark{mark("west", t1, 80), mark("east", t1, 81)}, winner: "east", conflicts: []string{"west"}, clusters: "east,west"},
		{name: "port order does not matter", marks: []Mark{mark("a", t1, 80, 90), mark("b", t2, 90, 80)}, winner: "a", clusters: "a,b"},
		{name: "several losers", marks: []Mark{mark("c", t2, 1), mark("a", t1, 2), mark("b", t2, 2), mark("d", t2, 3)}, winner: "a", conflicts: []string{"c", "d"}, clusters: "a,b,c,d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Any order of the same marks gives the same outcome.
			for i := range 20 {
				ms := append([]Mark(nil), tc.marks...)
				rand.New(rand.NewPCG(uint64(i), 7)).Shuffle(len(ms), func(a, b int) { ms[a], ms[b] = ms[b], ms[a] })
				r, ok := Resolve(ms)
				if !ok {
					t.Fatal("Resolve: not ok")
				}
				if r.Winner.Origin.Cluster != tc.winner {
					t.Fatalf("winner %s, want %s", r.Winner.Origin.Cluster, tc.winner)
				}
				if got := strings.Join(r.Clusters, ","); got != tc.clusters {
					t.Errorf("clusters %s, want %s", got, tc.clusters)
				}
				if len(r.Conflicts) != len(tc.conflicts) {
					t.Fatalf("conflicts %v, want %v", r.Conflicts, tc.conflicts)
				}
				for _, c := range tc.conflicts {
					o := registry.Origin{Region: "r1", Cluster: c}
					if r.Conflicts[o] != mcsv1beta1.ServiceExportReasonPortConflict {
						t.Errorf("cluster %s: reason %q, want PortConflict", c, r.Conflicts[o])
					}
					if cc := ConflictCondition(r, o, 3); cc.Status != metav1.ConditionTrue || !strings.Contains(cc.Message, "cluster "+tc.winner) || cc.ObservedGeneration != 3 {
						t.Errorf("condition for %s = %+v", c, cc)
					}
				}
				if cc := ConflictCondition(r, r.Winner.Origin, 1); cc.Status != metav1.ConditionFalse || cc.Reason != string(mcsv1beta1.ServiceExportReasonNoConflicts) {
					t.Errorf("winner's condition = %+v", cc)
				}
			}
		})
	}
	if _, ok := Resolve(nil); ok {
		t.Error("Resolve(nil) ok")
	}
}

func service(mod func(*corev1.Service)) *corev1.Service {
	h2c := "kubernetes.io/h2c"
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "svc"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.0.0.1", Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
			{Name: "h2", Port: 81, TargetPort: intstr.FromString("h2"), AppProtocol: &h2c},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		}},
	}
	if mod != nil {
		mod(s)
	}
	return s
}

func TestMarkFromService(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	m, err := MarkFromService(service(nil), created)
	if err != nil {
		t.Fatal(err)
	}
	if m.CreateTime != "2026-01-02T02:04:05Z" {
		t.Errorf("create_time %q", m.CreateTime)
	}
	if err := registry.ValidateExport(m); err != nil {
		t.Errorf("mark does not validate: %v", err)
	}
	want := []string{"http/80/8080/PROTOCOL_HTTP", "h2/81/0/PROTOCOL_HTTP2", "dns/53/0/PROTOCOL_UDP"}
	for i, p := range m.Ports {
		got := p.Name + "/" + itoa(p.Port) + "/" + itoa(p.TargetPort) + "/" + p.Protocol.String()
		if got != want[i] {
			t.Errorf("port %d = %s, want %s", i, got, want[i])
		}
	}
	// 53/UDP beside 53/TCP (the shape of kube-dns's own Service) is one exportable Service; an
	// SCTP port is not captured, so not meshed: it is left out, not exported as HTTP beside 80/TCP.
	both, err := MarkFromService(service(func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP},
			corev1.ServicePort{Name: "sctp", Port: 80, Protocol: corev1.ProtocolSCTP})
	}), created)
	if err != nil {
		t.Fatal(err)
	}
	if err := registry.ValidateExport(both); err != nil {
		t.Errorf("mark of 53/UDP beside 53/TCP does not validate: %v", err)
	}
	var got []string
	for _, p := range both.Ports {
		got = append(got, p.Name+"/"+itoa(p.Port)+"/"+p.Protocol.String())
	}
	if want := []string{"http/80/PROTOCOL_HTTP", "h2/81/PROTOCOL_HTTP2", "dns/53/PROTOCOL_UDP", "dns-tcp/53/PROTOCOL_HTTP"}; !slices.Equal(got, want) {
		t.Errorf("ports = %q, want %q", got, want)
	}
	again, _ := MarkFromService(service(nil), created)
	if !SameMark(m, again) {
		t.Error("the same Service gives a different mark")
	}
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		reason mcsv1beta1.ServiceExportConditionReason
	}{
		{"no service", nil, mcsv1beta1.ServiceExportReasonNoService},
		{"external name", service(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }), mcsv1beta1.ServiceExportReasonInvalidServiceType},
		{"headless", service(func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }), mcsv1beta1.ServiceExportReasonInvalidServiceType},
		{"aether's own", service(func(s *corev1.Service) { s.Labels = map[string]string{model.LabelManagedBy: model.ManagedByAether} }), mcsv1beta1.ServiceExportReasonInvalidServiceType},
		{"no ports", service(func(s *corev1.Service) { s.Spec.Ports = nil }), mcsv1beta1.ServiceExportReasonInvalidServiceType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := MarkFromService(tc.svc, created)
			var inv *InvalidExportError
			if !errors.As(err, &inv) || inv.Reason != tc.reason {
				t.Errorf("err = %v, want reason %s", err, tc.reason)
			}
		})
	}
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

func TestDesiredObjects(t *testing.T) {
	m, err := MarkFromService(service(nil), time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	o := registry.Origin{Region: "r1", Cluster: "east"}
	r, _ := Resolve([]Mark{{Key: o.ExportKey("ns", "svc"), Origin: o, Value: m}})
	si := DesiredImport("ns", "svc", r, []string{"10.96.0.10"})
	if si.Spec.Type != mcsv1beta1.ClusterSetIP || si.Spec.IPs[0] != "10.96.0.10" || si.Labels[model.LabelManagedBy] != model.ManagedByAether ||
		len(si.Status.Clusters) != 1 || si.Status.Clusters[0].Cluster != "east" {
		t.Errorf("import = %+v", si)
	}
	var got []string
	for _, p := range si.Spec.Ports {
		a := "-"
		if p.AppProtocol != nil {
			a = *p.AppProtocol
		}
		got = append(got, p.Name+"/"+string(p.Protocol)+"/"+a)
	}
	if strings.Join(got, " ") != "http/TCP/- h2/TCP/kubernetes.io/h2c dns/UDP/-" {
		t.Errorf("import ports = %v", got)
	}
	cs, err := DesiredClustersetService("ns", "svc", r)
	if err != nil {
		t.Fatal(err)
	}
	if cs.Name != "svc-clusterset" || cs.Annotations[model.AnnotationMeshService] != "ns/svc" || cs.Annotations[model.AnnotationMeshPort] != "80,81,53" ||
		cs.Spec.Selector != nil || cs.Labels[model.LabelManagedBy] != model.ManagedByAether || len(cs.Spec.Ports) != 3 {
		t.Errorf("clusterset Service = %+v", cs)
	}
	if _, err := DesiredClustersetService("ns", strings.Repeat("a", 54), r); err == nil {
		t.Error("a 64-character clusterset Service name was accepted")
	}
}
