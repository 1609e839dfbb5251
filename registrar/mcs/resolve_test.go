package mcs

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// mark is an export mark of ns/svc from cluster (region r1) created at created, with ports
// written "name:port" (HTTP) or "name:port/PROTOCOL_X".
func mark(cluster, created string, ports ...string) Mark {
	o := registry.Origin{Region: "r1", Cluster: cluster}
	m := &registryv1.ExportMark{Service: &registryv1.ServiceRef{Namespace: "ns", Name: "svc"}, ClusterName: cluster, Region: "r1", CreateTime: created}
	for _, p := range ports {
		name, rest, _ := strings.Cut(p, ":")
		num, proto, _ := strings.Cut(rest, "/")
		n, err := strconv.Atoi(num)
		if err != nil {
			panic(p)
		}
		sp := &registryv1.ServicePort{Name: name, Port: uint32(n), TargetPort: uint32(n) + 1, Protocol: registryv1.Protocol_PROTOCOL_HTTP}
		if proto != "" {
			sp.Protocol = registryv1.Protocol(registryv1.Protocol_value[proto])
		}
		m.Ports = append(m.Ports, sp)
	}
	return Mark{Key: o.ExportKey("ns", "svc"), Origin: o, Value: m}
}

func withMeta(m Mark, f func(*registryv1.ExportMark)) Mark {
	m.Value = proto.Clone(m.Value).(*registryv1.ExportMark)
	f(m.Value)
	return m
}

func TestResolve(t *testing.T) {
	const t1, t2 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z"
	team := func(v string) func(*registryv1.ExportMark) {
		return func(m *registryv1.ExportMark) { m.ExportedLabels = map[string]string{"team": v} }
	}
	note := func(v string) func(*registryv1.ExportMark) {
		return func(m *registryv1.ExportMark) { m.ExportedAnnotations = map[string]string{"example.com/note": v} }
	}
	clientIP := func(timeout uint32) func(*registryv1.ExportMark) {
		return func(m *registryv1.ExportMark) {
			m.SessionAffinity, m.SessionAffinityTimeoutSeconds = "ClientIP", timeout
		}
	}
	for _, tc := range []struct {
		name     string
		marks    []Mark
		oldest   string
		ports    string // name:port/PROTO@winner for each imported port
		clusters string
		reason   string // the Conflict reason, "" for NoConflicts
		// msg maps a cluster to text its Conflict message must hold.
		msg map[string]string
	}{
		{name: "one export", marks: []Mark{mark("a", t1, "http:80")}, oldest: "a", ports: "http:80/HTTP@a", clusters: "a"},
		{name: "compatible exports, target ports differ", marks: []Mark{mark("b", t1, "http:80"), withMeta(mark("a", t2, "http:80"), func(m *registryv1.ExportMark) { m.Ports[0].TargetPort = 9 })},
			oldest: "b", ports: "http:80/HTTP@b", clusters: "a,b"},
		{name: "port order does not matter", marks: []Mark{mark("a", t1, "http:80", "grpc:90/PROTOCOL_GRPC"), mark("b", t2, "grpc:90/PROTOCOL_GRPC", "http:80")},
			oldest: "a", ports: "http:80/HTTP@a grpc:90/GRPC@a", clusters: "a,b"},
		{name: "union by port", marks: []Mark{mark("a", t1, "http:80"), mark("b", t2, "http:80", "admin:7070/PROTOCOL_TCP")},
			oldest: "a", ports: "http:80/HTTP@a admin:7070/TCP@b", clusters: "a,b", reason: "PortConflict",
			msg: map[string]string{"a": `port "admin" 7070/TCP from cluster b, traffic to cluster(s) b: this export does not define it`,
				"b": `port "admin" 7070/TCP from cluster b, traffic to cluster(s) b: this export's definition`}},
		{name: "oldest wins over name order", marks: []Mark{mark("z", t1, "http:80"), mark("a", t2, "http:8080")},
			oldest: "z", ports: "http:80/HTTP@z", clusters: "a,z", reason: "PortConflict",
			msg: map[string]string{"a": `port "http" 80/HTTP from cluster z, traffic to cluster(s) z: this export's port "http" 8080/HTTP is not imported`,
				"z": `port "http" 80/HTTP from cluster z, traffic to cluster(s) z: this export's definition`}},
		{name: "same time: cluster name decides", marks: []Mark{mark("west", t1, "http:80"), mark("east", t1, "http:81")},
			oldest: "east", ports: "http:81/HTTP@east", clusters: "east,west", reason: "PortConflict",
			msg: map[string]string{"west": `port "http" 81/HTTP from cluster east`}},
		{name: "conflict per port: the other ports merge", marks: []Mark{mark("b", t2, "http:8000", "grpc:9090/PROTOCOL_GRPC"), mark("a", t1, "http:80", "grpc:9090/PROTOCOL_GRPC")},
			oldest: "a", ports: "http:80/HTTP@a grpc:9090/GRPC@a", clusters: "a,b", reason: "PortConflict",
			msg: map[string]string{"b": `port "http" 80/HTTP from cluster a, traffic to cluster(s) a: this export's port "http" 8000/HTTP is not imported`}},
		{name: "several losers", marks: []Mark{mark("c", t2, "http:1"), mark("a", t1, "http:2"), mark("b", t2, "http:2"), mark("d", t2, "http:3")},
			oldest: "a", ports: "http:2/HTTP@a", clusters: "a,b,c,d", reason: "PortConflict",
			msg: map[string]string{"b": `traffic to cluster(s) a,b: this export defines it the same way`, "c": `port "http" 1/HTTP is not imported`,
				"d": `port "http" 3/HTTP is not imported`}},
		{name: "same number under another name", marks: []Mark{mark("a", t1, "http:80"), mark("b", t2, "web:80/PROTOCOL_TCP")},
			oldest: "a", ports: "http:80/HTTP@a", clusters: "a,b", reason: "PortConflict",
			msg: map[string]string{"b": `port "web" 80/TCP (same protocol and number under another name) is not imported`}},
		{name: "labels: the oldest export's", marks: []Mark{withMeta(mark("b", t2, "http:80"), team("b")), withMeta(mark("a", t1, "http:80"), team("a"))},
			oldest: "a", ports: "http:80/HTTP@a", clusters: "a,b", reason: "LabelsConflict",
			msg: map[string]string{"b": "exportedLabels differ between the exports: those of cluster a (region r1, the oldest export, created " + t1 + ") are used; this export's differ",
				"a": "those of this export (the oldest) are used"}},
		{name: "equal labels, annotations differ", marks: []Mark{withMeta(withMeta(mark("a", t1, "http:80"), team("x")), note("1")), withMeta(mark("b", t2, "http:80"), team("x"))},
			oldest: "a", ports: "http:80/HTTP@a", clusters: "a,b", reason: "AnnotationsConflict"},
		{name: "session affinity and ports", marks: []Mark{withMeta(mark("a", t1, "http:80"), clientIP(60)), mark("b", t2, "http:81")},
			oldest: "a", ports: "http:80/HTTP@a", clusters: "a,b", reason: "PortConflict,SessionAffinityConflict",
			msg: map[string]string{"b": "session affinity: ClientIP of cluster a"}},
		{name: "session affinity timeout", marks: []Mark{withMeta(mark("a", t1, "http:80"), clientIP(60)), withMeta(mark("b", t2, "http:80"), clientIP(10800))},
			oldest: "a", ports: "http:80/HTTP@a", clusters: "a,b", reason: "SessionAffinityConfigConflict",
			msg: map[string]string{"b": "session affinity timeout: 60s of cluster a"}},
		{name: "None and unset affinity agree", marks: []Mark{withMeta(mark("a", t1, "http:80"), func(m *registryv1.ExportMark) { m.SessionAffinity = "None" }), mark("b", t2, "http:80")},
			oldest: "a", ports: "http:80/HTTP@a", clusters: "a,b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var first metav1.Condition
			// Any order of the same marks gives the same outcome.
			for i := range 20 {
				ms := append([]Mark(nil), tc.marks...)
				rand.New(rand.NewPCG(uint64(i), 7)).Shuffle(len(ms), func(a, b int) { ms[a], ms[b] = ms[b], ms[a] })
				r, ok := Resolve(ms)
				if !ok {
					t.Fatal("Resolve: not ok")
				}
				if r.Oldest().Origin.Cluster != tc.oldest {
					t.Fatalf("oldest %s, want %s", r.Oldest().Origin.Cluster, tc.oldest)
				}
				var ports []string
				for _, mp := range r.Ports.Ports {
					ports = append(ports, fmt.Sprintf("%s:%d/%s@%s", mp.Port.Name, mp.Port.Port, mp.Port.Protocol, mp.Winner.Cluster))
				}
				if got := strings.Join(ports, " "); got != tc.ports {
					t.Fatalf("ports %s, want %s", got, tc.ports)
				}
				if got := strings.Join(r.Clusters, ","); got != tc.clusters {
					t.Errorf("clusters %s, want %s", got, tc.clusters)
				}
				// Every export of the service gets the same Conflict status and reason (KEP-1645:
				// "on all ServiceExports for the conflicted service").
				for _, m := range tc.marks {
					cc := ConflictCondition(r, m.Origin, 3)
					if cc.ObservedGeneration != 3 || cc.Type != string(mcsv1beta1.ServiceExportConditionConflict) {
						t.Errorf("condition for %s = %+v", m.Origin.Cluster, cc)
					}
					if tc.reason == "" {
						if cc.Status != metav1.ConditionFalse || cc.Reason != string(mcsv1beta1.ServiceExportReasonNoConflicts) {
							t.Errorf("%s: condition %s/%s %q, want False/NoConflicts", m.Origin.Cluster, cc.Status, cc.Reason, cc.Message)
						}
						continue
					}
					if cc.Status != metav1.ConditionTrue || cc.Reason != tc.reason {
						t.Errorf("%s: condition %s/%s, want True/%s", m.Origin.Cluster, cc.Status, cc.Reason, tc.reason)
					}
					if want := tc.msg[m.Origin.Cluster]; !strings.Contains(cc.Message, want) {
						t.Errorf("%s: message %q\nwant it to hold %q", m.Origin.Cluster, cc.Message, want)
					}
					if m.Origin.Cluster == tc.oldest && i == 0 {
						first = cc
					} else if m.Origin.Cluster == tc.oldest && cc != first {
						t.Errorf("order %d: the oldest's condition changed: %+v, was %+v", i, cc, first)
					}
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

// export is a ServiceExport ns/svc created at created, changed by mod.
func export(created time.Time, mod func(*mcsv1beta1.ServiceExport)) *mcsv1beta1.ServiceExport {
	se := &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "svc", CreationTimestamp: metav1.NewTime(created)}}
	if mod != nil {
		mod(se)
	}
	return se
}

func TestMarkFromService(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	m, err := MarkFromService(service(nil), export(created, nil))
	if err != nil {
		t.Fatal(err)
	}
	if m.CreateTime != "2026-01-02T02:04:05Z" {
		t.Errorf("create_time %q", m.CreateTime)
	}
	if err := registry.ValidateExport(m); err != nil {
		t.Errorf("mark does not validate: %v", err)
	}
	if m.SessionAffinity != "" || m.SessionAffinityTimeoutSeconds != 0 || m.ExportedLabels != nil || m.ExportedAnnotations != nil {
		t.Errorf("mark of a plain export: affinity %q/%d, labels %v, annotations %v", m.SessionAffinity, m.SessionAffinityTimeoutSeconds, m.ExportedLabels, m.ExportedAnnotations)
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
	}), export(created, nil))
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
	again, _ := MarkFromService(service(nil), export(created, nil))
	if !SameMark(m, again) {
		t.Error("the same Service gives a different mark")
	}

	// exportedLabels and exportedAnnotations come from the ServiceExport, session affinity from
	// the Service; each is part of what SameMark compares.
	labelled := func(se *mcsv1beta1.ServiceExport) {
		se.Spec.ExportedLabels = map[string]string{"team": "shop", "example.com/tier": "1"}
		se.Spec.ExportedAnnotations = map[string]string{"example.com/owner": "shop team <shop@example.com>"}
	}
	affine := func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(600))}}
	}
	full, err := MarkFromService(service(affine), export(created, labelled))
	if err != nil {
		t.Fatal(err)
	}
	if err := registry.ValidateExport(full); err != nil {
		t.Errorf("mark does not validate: %v", err)
	}
	if full.ExportedLabels["team"] != "shop" || full.ExportedAnnotations["example.com/owner"] == "" || full.SessionAffinity != "ClientIP" || full.SessionAffinityTimeoutSeconds != 600 {
		t.Errorf("mark = %v", full)
	}
	for name, mod := range map[string]func(*registryv1.ExportMark){
		"labels":      func(m *registryv1.ExportMark) { m.ExportedLabels["team"] = "other" },
		"annotations": func(m *registryv1.ExportMark) { m.ExportedAnnotations = nil },
		"affinity":    func(m *registryv1.ExportMark) { m.SessionAffinity, m.SessionAffinityTimeoutSeconds = "", 0 },
		"timeout":     func(m *registryv1.ExportMark) { m.SessionAffinityTimeoutSeconds = 60 },
	} {
		changed := proto.Clone(full).(*registryv1.ExportMark)
		mod(changed)
		if SameMark(full, changed) {
			t.Errorf("SameMark misses a change of %s", name)
		}
	}
	none, _ := MarkFromService(service(func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityNone }), export(created, nil))
	if !SameMark(m, none) {
		t.Error("sessionAffinity None gives another mark than unset")
	}

	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		se     *mcsv1beta1.ServiceExport
		reason mcsv1beta1.ServiceExportConditionReason
		msg    string
	}{
		{"no service", nil, nil, mcsv1beta1.ServiceExportReasonNoService, ""},
		{"external name", service(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }), nil, mcsv1beta1.ServiceExportReasonInvalidServiceType, ""},
		{"headless", service(func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }), nil, mcsv1beta1.ServiceExportReasonInvalidServiceType, ""},
		{"aether's own", service(func(s *corev1.Service) { s.Labels = map[string]string{model.LabelManagedBy: model.ManagedByAether} }), nil, mcsv1beta1.ServiceExportReasonInvalidServiceType, ""},
		{"no ports", service(func(s *corev1.Service) { s.Spec.Ports = nil }), nil, mcsv1beta1.ServiceExportReasonInvalidServiceType, ""},
		{"reserved label aether.io/managed-by", service(nil), export(created, func(se *mcsv1beta1.ServiceExport) {
			se.Spec.ExportedLabels = map[string]string{"team": "x", model.LabelManagedBy: "someone"}
		}), ServiceExportReasonInvalidExportedMetadata, `spec.exportedLabels["aether.io/managed-by"]: reserved`},
		{"reserved label of an aether.io subdomain", service(nil), export(created, func(se *mcsv1beta1.ServiceExport) {
			se.Spec.ExportedLabels = map[string]string{"endpoint.aether.io/protocol": "tcp"}
		}), ServiceExportReasonInvalidExportedMetadata, `spec.exportedLabels["endpoint.aether.io/protocol"]: reserved`},
		{"reserved label: the MCS service name", service(nil), export(created, func(se *mcsv1beta1.ServiceExport) {
			se.Spec.ExportedLabels = map[string]string{mcsv1beta1.LabelServiceName: "other"}
		}), ServiceExportReasonInvalidExportedMetadata, `spec.exportedLabels["multicluster.kubernetes.io/service-name"]: reserved`},
		{"reserved annotation", service(nil), export(created, func(se *mcsv1beta1.ServiceExport) {
			se.Spec.ExportedAnnotations = map[string]string{model.AnnotationMeshService: "ns/other"}
		}), ServiceExportReasonInvalidExportedMetadata, `spec.exportedAnnotations["aether.io/mesh-service"]: reserved`},
		{"invalid label value", service(nil), export(created, func(se *mcsv1beta1.ServiceExport) {
			se.Spec.ExportedLabels = map[string]string{"team": "not a label value"}
		}), ServiceExportReasonInvalidExportedMetadata, `spec.exportedLabels: "not a label value"`},
		{"invalid annotation key", service(nil), export(created, func(se *mcsv1beta1.ServiceExport) {
			se.Spec.ExportedAnnotations = map[string]string{"not a key": "x"}
		}), ServiceExportReasonInvalidExportedMetadata, `spec.exportedAnnotations: "not a key"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			se := tc.se
			if se == nil {
				se = export(created, nil)
			}
			_, err := MarkFromService(tc.svc, se)
			var inv *InvalidExportError
			if !errors.As(err, &inv) || inv.Reason != tc.reason || !strings.Contains(inv.Message, tc.msg) {
				t.Errorf("err = %v, want reason %s and %q", err, tc.reason, tc.msg)
			}
		})
	}
	// A key that merely mentions aether is not reserved.
	if _, err := MarkFromService(service(nil), export(created, func(se *mcsv1beta1.ServiceExport) {
		se.Spec.ExportedLabels = map[string]string{"notaether.io/x": "y", "aether": "z"}
	})); err != nil {
		t.Errorf("unreserved keys refused: %v", err)
	}
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

func ptr[T any](v T) *T { return &v }

func TestDesiredObjects(t *testing.T) {
	created := time.Unix(0, 0)
	m, err := MarkFromService(service(nil), export(created, func(se *mcsv1beta1.ServiceExport) {
		se.Spec.ExportedLabels = map[string]string{"team": "shop"}
		se.Spec.ExportedAnnotations = map[string]string{"example.com/owner": "shop"}
	}))
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
	if si.Labels["team"] != "shop" || len(si.Labels) != 2 || si.Annotations["example.com/owner"] != "shop" || len(si.Annotations) != 1 {
		t.Errorf("import metadata: labels %v, annotations %v", si.Labels, si.Annotations)
	}
	if si.Spec.SessionAffinity != corev1.ServiceAffinityNone || si.Spec.SessionAffinityConfig != nil {
		t.Errorf("import session affinity %q %v, want None", si.Spec.SessionAffinity, si.Spec.SessionAffinityConfig)
	}
	// A mark written into the registry without the exporting registrar's checks: its reserved
	// keys never reach the ServiceImport (and aether's own label keeps its value).
	forged := proto.Clone(m).(*registryv1.ExportMark)
	forged.ExportedLabels = map[string]string{model.LabelManagedBy: "someone", "multicluster.kubernetes.io/service-name": "x", "team": "shop"}
	forged.ExportedAnnotations = map[string]string{"aether.io/mesh-service": "other/svc", "sub.aether.io/x": "y"}
	rf, _ := Resolve([]Mark{{Key: o.ExportKey("ns", "svc"), Origin: o, Value: forged}})
	if fi := DesiredImport("ns", "svc", rf, nil); len(fi.Labels) != 2 || fi.Labels[model.LabelManagedBy] != model.ManagedByAether || fi.Labels["team"] != "shop" || len(fi.Annotations) != 0 {
		t.Errorf("import of a forged mark: labels %v, annotations %v; want only team and aether's own label", fi.Labels, fi.Annotations)
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

	// Two exports: the union of the ports (the younger export adds grpc), the oldest export's
	// labels and ClientIP affinity.
	younger, err := MarkFromService(service(func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports[:1], corev1.ServicePort{Name: "grpc", Port: 9090, AppProtocol: ptr("grpc")})
	}), export(created.Add(time.Second), func(se *mcsv1beta1.ServiceExport) { se.Spec.ExportedLabels = map[string]string{"team": "other"} }))
	if err != nil {
		t.Fatal(err)
	}
	m.SessionAffinity, m.SessionAffinityTimeoutSeconds = "ClientIP", 300
	w := registry.Origin{Region: "r1", Cluster: "west"}
	r, _ = Resolve([]Mark{{Key: w.ExportKey("ns", "svc"), Origin: w, Value: younger}, {Key: o.ExportKey("ns", "svc"), Origin: o, Value: m}})
	si = DesiredImport("ns", "svc", r, nil)
	got = nil
	for _, p := range si.Spec.Ports {
		got = append(got, p.Name+":"+strconv.Itoa(int(p.Port)))
	}
	if strings.Join(got, " ") != "http:80 h2:81 dns:53 grpc:9090" {
		t.Errorf("union ports = %v", got)
	}
	if si.Labels["team"] != "shop" || si.Spec.SessionAffinity != corev1.ServiceAffinityClientIP ||
		si.Spec.SessionAffinityConfig == nil || *si.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds != 300 {
		t.Errorf("import from the oldest export: labels %v, affinity %q %v", si.Labels, si.Spec.SessionAffinity, si.Spec.SessionAffinityConfig)
	}
	if cs, _ := DesiredClustersetService("ns", "svc", r); cs.Annotations[model.AnnotationMeshPort] != "80,81,53,9090" {
		t.Errorf("clusterset Service ports %s", cs.Annotations[model.AnnotationMeshPort])
	}
}

func TestOwnedMetadata(t *testing.T) {
	have := map[string]string{model.LabelManagedBy: model.ManagedByAether, "team": "old", "kubectl-added": "x", "aether.io/other-part": "keep", "drift.aether.io/x": "keep"}
	want := map[string]string{model.LabelManagedBy: model.ManagedByAether, "team": "new"}
	got := ownedMetadata(have, want)
	exp := map[string]string{model.LabelManagedBy: model.ManagedByAether, "team": "new", "aether.io/other-part": "keep", "drift.aether.io/x": "keep"}
	if !maps.Equal(got, exp) {
		t.Errorf("ownedMetadata = %v, want %v", got, exp)
	}
	if got := ownedMetadata(map[string]string{"a": "b"}, nil); got != nil {
		t.Errorf("ownedMetadata without wanted keys = %v, want nil", got)
	}
}
