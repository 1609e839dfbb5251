package substrate

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type fakeView struct {
	svcs map[string]*corev1.Service
	pods []netip.Addr
}

func (v fakeView) service(ns, name string) (*corev1.Service, bool) {
	s, ok := v.svcs[ns+"/"+name]
	return s, ok
}

func (v fakeView) selectedPodIPs(string, map[string]string) []netip.Addr { return v.pods }

func TestStubDNS(t *testing.T) {
	view := fakeView{
		svcs: map[string]*corev1.Service{
			"demo/echo": {ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "echo"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.3.4"}},
			"demo/db":   {ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "db"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"app": "db"}}},
		},
		pods: []netip.Addr{netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("10.244.0.7")},
	}
	static := map[string][]netip.Addr{"registry.aether.test.": {netip.MustParseAddr("172.30.1.1")}}
	s := &stubDNS{zone: "cluster.local.", lookup: func(n string) ([]netip.Addr, bool) { return lookupCluster(n, "cluster.local.", view, static) }}
	for _, tc := range []struct {
		name    string
		qname   string
		qtype   uint16
		rcode   int
		answers []string
		soa     bool
	}{
		{"service", "echo.demo.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10.96.3.4"}, false},
		{"case-insensitive", "ECHO.Demo.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10.96.3.4"}, false},
		{"headless", "db.demo.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10.244.1.5", "10.244.0.7"}, false},
		{"pod name", "10-244-1-5.demo.pod.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10.244.1.5"}, false},
		{"AAAA is NODATA", "echo.demo.svc.cluster.local.", dns.TypeAAAA, dns.RcodeSuccess, nil, true},
		{"empty non-terminal", "demo.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, nil, true},
		{"zone apex", "cluster.local.", dns.TypeA, dns.RcodeSuccess, nil, true},
		{"unknown service", "nope.demo.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil, true},
		{"unknown shape", "a.b.c.d.cluster.local.", dns.TypeA, dns.RcodeNameError, nil, true},
		{"search expansion", "echo.demo.svc.cluster.local.demo.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil, true},
		{"outside the zone", "example.com.", dns.TypeA, dns.RcodeNameError, nil, false},
		{"static outside the zone is still not served", "registry.aether.test.", dns.TypeA, dns.RcodeNameError, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := new(dns.Msg)
			req.SetQuestion(tc.qname, tc.qtype)
			m := s.answer(req)
			if m.Rcode != tc.rcode {
				t.Fatalf("rcode %s, want %s", dns.RcodeToString[m.Rcode], dns.RcodeToString[tc.rcode])
			}
			var got []string
			for _, rr := range m.Answer {
				got = append(got, rr.(*dns.A).A.String())
			}
			if !slices.Equal(got, tc.answers) {
				t.Errorf("answers %v, want %v", got, tc.answers)
			}
			if hasSOA := len(m.Ns) == 1; hasSOA != tc.soa {
				t.Errorf("authority %v, want SOA: %v", m.Ns, tc.soa)
			}
		})
	}
	// Static names inside the zone are answered.
	static["gw.cluster.local."] = []netip.Addr{netip.MustParseAddr("172.30.1.1")}
	req := new(dns.Msg)
	req.SetQuestion("gw.cluster.local.", dns.TypeA)
	if m := s.answer(req); len(m.Answer) != 1 {
		t.Errorf("static record in zone: %v", m)
	}
}
