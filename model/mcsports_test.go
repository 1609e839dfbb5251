package model

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// xmark is an export mark of shop/pay from cluster c (region r1), created at second sec, with
// ports written "name:port/PROTO" (PROTO a Protocol; "" name allowed).
func xmark(c string, sec int, ports ...string) ExportMark {
	m := ExportMark{Service: ServiceKey{"shop", "pay"}, Cluster: c, Region: "r1", Created: t0.Add(time.Duration(sec) * time.Second)}
	for _, p := range ports {
		var name, proto string
		var num uint32
		name, rest, _ := strings.Cut(p, ":")
		if _, err := fmt.Sscanf(strings.Replace(rest, "/", " ", 1), "%d %s", &num, &proto); err != nil {
			panic(p)
		}
		m.Ports = append(m.Ports, ServicePort{Name: name, Port: num, TargetPort: num + 1000, Protocol: Protocol(proto)})
	}
	return m
}

// describeMerge renders a merge as "name:port/PROTO@winner[serving...]" per port and
// "cluster:name:port/PROTO~reason->merged" per clash.
func describeMerge(pm PortMerge) (ports, clashes string) {
	var ps, cs []string
	for _, mp := range pm.Ports {
		var serving []string
		for _, o := range mp.Serving {
			serving = append(serving, o.Cluster)
		}
		ps = append(ps, fmt.Sprintf("%s:%d/%s@%s[%s]", mp.Port.Name, mp.Port.Port, mp.Port.Protocol, mp.Winner.Cluster, strings.Join(serving, ",")))
	}
	for _, c := range pm.Clashes {
		cs = append(cs, fmt.Sprintf("%s:%s:%d/%s~%s->%s", c.Export.Cluster, c.Port.Name, c.Port.Port, c.Port.Protocol, c.Reason, pm.Ports[c.Merged].Port.Name))
	}
	return strings.Join(ps, " "), strings.Join(cs, " ")
}

func TestMergeExportPorts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		marks    []ExportMark
		ports    string
		clashes  string
		conflict bool
	}{
		{name: "one export", marks: []ExportMark{xmark("a", 0, "http:80/HTTP", "dns:53/UDP")},
			ports: "http:80/HTTP@a[a] dns:53/UDP@a[a]"},
		{name: "identical exports, target ports differ", marks: []ExportMark{xmark("b", 0, "http:80/HTTP"), func() ExportMark {
			m := xmark("a", 1, "http:80/HTTP")
			m.Ports[0].TargetPort = 9999
			return m
		}()}, ports: "http:80/HTTP@b[b,a]"},
		{name: "union of disjoint ports is a conflict", marks: []ExportMark{xmark("a", 0, "http:80/HTTP"), xmark("b", 1, "grpc:9090/GRPC")},
			ports: "http:80/HTTP@a[a] grpc:9090/GRPC@b[b]", conflict: true},
		{name: "oldest wins over name order", marks: []ExportMark{xmark("z", 0, "http:80/HTTP"), xmark("a", 1, "http:8080/HTTP")},
			ports: "http:80/HTTP@z[z]", clashes: "a:http:8080/HTTP~DifferentDefinition->http", conflict: true},
		{name: "same second: the smaller cluster name wins", marks: []ExportMark{xmark("west", 0, "http:80/HTTP"), xmark("east", 0, "http:81/HTTP")},
			ports: "http:81/HTTP@east[east]", clashes: "west:http:80/HTTP~DifferentDefinition->http", conflict: true},
		{name: "conflict per port, not per port set", marks: []ExportMark{
			xmark("a", 0, "http:80/HTTP", "grpc:9090/GRPC"),
			xmark("b", 1, "http:8000/HTTP", "grpc:9090/GRPC", "admin:7070/TCP"),
		}, ports: "http:80/HTTP@a[a] grpc:9090/GRPC@a[a,b] admin:7070/TCP@b[b]", clashes: "b:http:8000/HTTP~DifferentDefinition->http", conflict: true},
		{name: "appProtocol differs", marks: []ExportMark{xmark("a", 0, "api:80/HTTP"), xmark("b", 1, "api:80/GRPC")},
			ports: "api:80/HTTP@a[a]", clashes: "b:api:80/GRPC~DifferentDefinition->api", conflict: true},
		{name: "L4 protocol differs", marks: []ExportMark{xmark("a", 0, "dns:53/UDP"), xmark("b", 1, "dns:53/TCP")},
			ports: "dns:53/UDP@a[a]", clashes: "b:dns:53/TCP~DifferentDefinition->dns", conflict: true},
		{name: "same number and protocol under another name", marks: []ExportMark{xmark("a", 0, "http:80/HTTP"), xmark("b", 1, "web:80/TCP", "dns:80/UDP")},
			ports: "http:80/HTTP@a[a] dns:80/UDP@b[b]", clashes: "b:web:80/TCP~SameNumber->http", conflict: true},
		{name: "unnamed port stays alone", marks: []ExportMark{xmark("a", 0, ":80/HTTP"), xmark("b", 1, "metrics:9100/HTTP"), xmark("c", 2, ":80/HTTP")},
			ports: ":80/HTTP@a[a,c]", clashes: "b:metrics:9100/HTTP~Unnamed->", conflict: true},
		{name: "no unnamed port beside named ones", marks: []ExportMark{xmark("a", 0, "http:80/HTTP"), xmark("b", 1, ":9100/HTTP")},
			ports: "http:80/HTTP@a[a]", clashes: "b::9100/HTTP~Unnamed->http", conflict: true},
		{name: "several losers", marks: []ExportMark{
			xmark("c", 1, "http:1/HTTP"), xmark("a", 0, "http:2/HTTP"), xmark("b", 1, "http:2/HTTP"), xmark("d", 1, "http:3/HTTP"),
		}, ports: "http:2/HTTP@a[a,b]", clashes: "c:http:1/HTTP~DifferentDefinition->http d:http:3/HTTP~DifferentDefinition->http", conflict: true},
		{name: "a mark without ports is left out", marks: []ExportMark{xmark("a", 0, "http:80/HTTP"), {Service: ServiceKey{"shop", "pay"}, Cluster: "b"}},
			ports: "http:80/HTTP@a[a]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var first PortMerge
			for i := range 20 {
				ms := slices.Clone(tc.marks)
				rand.New(rand.NewPCG(uint64(i), 3)).Shuffle(len(ms), func(a, b int) { ms[a], ms[b] = ms[b], ms[a] })
				pm := MergeExportPorts(ms)
				ports, clashes := describeMerge(pm)
				if ports != tc.ports || clashes != tc.clashes || pm.Conflict != tc.conflict {
					t.Fatalf("order %d: ports %q, clashes %q, conflict %v; want %q, %q, %v", i, ports, clashes, pm.Conflict, tc.ports, tc.clashes, tc.conflict)
				}
				if i == 0 {
					first = pm
				} else if !reflect.DeepEqual(pm, first) {
					t.Fatalf("order %d gives another merge:\n%+v\nwas\n%+v", i, pm, first)
				}
				for _, mp := range pm.Ports {
					if mp.Port.TargetPort != 0 {
						t.Errorf("merged port %s keeps target port %d", mp.Port.Name, mp.Port.TargetPort)
					}
				}
			}
		})
	}
}

// TestAssembleImportPortFilter: shop/pay is exported by b (oldest: http 80, grpc 9090) and c
// (http 8000, grpc 9090, admin 7070). Each port's traffic reaches only the clusters whose export
// defines it the winning way: http only b, grpc b and c, admin only c. This cluster's own
// endpoints and services whose exports agree are not filtered.
func TestAssembleImportPortFilter(t *testing.T) {
	pay := ServiceKey{"shop", "pay"}
	cart := ServiceKey{"shop", "cart"}
	b := xmark("b", 0, "http:80/HTTP", "grpc:9090/GRPC")
	c := xmark("c", 5, "http:8000/HTTP", "grpc:9090/GRPC", "admin:7070/TCP")
	cartB, cartC := xmark("b", 0, "http:80/HTTP"), xmark("c", 0, "http:80/HTTP")
	cartB.Service, cartC.Service = cart, cart
	allPorts := []EndpointPort{{Name: "http", Port: 8080}, {Name: "grpc", Port: 9090}, {Name: "admin", Port: 7070}}
	imp := func(name string, ports ...mcsv1beta1.ServicePort) *mcsv1beta1.ServiceImport {
		return &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
			Spec: mcsv1beta1.ServiceImportSpec{IPs: []string{"10.96.5." + fmt.Sprint(len(name))}, Ports: ports}}
	}
	in := Sources{
		Cluster:        "b",
		MeshNamespaces: map[string]bool{"shop": true},
		Services: []*corev1.Service{svc("shop", "pay", "10.96.0.10", t0,
			corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
			corev1.ServicePort{Name: "grpc", Port: 9090, AppProtocol: ptr("grpc")})},
		Imports: []*mcsv1beta1.ServiceImport{
			imp("pay", mcsv1beta1.ServicePort{Name: "http", Port: 80}, mcsv1beta1.ServicePort{Name: "grpc", Port: 9090, AppProtocol: ptr("grpc")},
				mcsv1beta1.ServicePort{Name: "admin", Port: 7070, AppProtocol: ptr("tcp")}),
			imp("cart", mcsv1beta1.ServicePort{Name: "http", Port: 80}),
		},
		Endpoints: []Endpoint{
			{Service: pay, Cluster: "b", Region: "r1", PodUID: "b1", Ports: allPorts[:2]},
			{Service: pay, Cluster: "c", Region: "r1", PodUID: "c1", Ports: allPorts},
			{Service: cart, Cluster: "c", Region: "r1", PodUID: "c2", Ports: allPorts[:1]},
		},
		Exports: []ExportMark{c, cartC, b, cartB},
	}
	m := Assemble(1, in)
	serves := func(k ServiceKey, port string) string {
		var out []string
		for _, sp := range m.Service(k).Ports {
			if sp.Name != port {
				continue
			}
			for i := range m.Endpoints[k] {
				if _, ok := sp.EndpointPort(&m.Endpoints[k][i], m.Cluster); ok {
					out = append(out, m.Endpoints[k][i].PodUID)
				}
			}
		}
		return strings.Join(out, ",")
	}
	// pay is local in b too: its ports are the local Service's (http, grpc).
	for port, want := range map[string]string{"http": "b1", "grpc": "b1,c1"} {
		if got := serves(pay, port); got != want {
			t.Errorf("pay port %s served by %q, want %q", port, got, want)
		}
	}
	if got := serves(cart, "http"); got != "c2" {
		t.Errorf("cart (exports agree) http served by %q, want c2", got)
	}
	if in.Endpoints[1].Ports[0].Name != "http" || len(in.Endpoints[1].Ports) != 3 {
		t.Errorf("the input endpoint was changed: %+v", in.Endpoints[1])
	}

	// In cluster a, which imports pay only, the admin port (c's alone) reaches c only.
	in.Cluster = "a"
	in.Services = nil
	m = Assemble(2, in)
	for port, want := range map[string]string{"http": "b1", "grpc": "b1,c1", "admin": "c1"} {
		if got := serves(pay, port); got != want {
			t.Errorf("in a: pay port %s served by %q, want %q", port, got, want)
		}
	}
}
