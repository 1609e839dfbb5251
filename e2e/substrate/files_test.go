package substrate

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aethermesh/aether/internal/testenv"
)

func TestNewPlan(t *testing.T) {
	p, err := NewPlan(DefaultClusters("10.244.0.0/16", "10.244.0.0/16"), "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Golden(t, "plan-identical.json", append(b, '\n'))
	if p.Clusters[0].Nodes[1].PodSubnet != p.Clusters[1].Nodes[1].PodSubnet {
		t.Errorf("identical pod CIDRs must give identical node subnets")
	}
	if p.Clusters[0].Nodes[0].IP == p.Clusters[1].Nodes[0].IP {
		t.Errorf("node IPs must differ across clusters")
	}
}

func TestNewPlanErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		specs []ClusterSpec
		want  string
	}{
		{"no clusters", nil, "want 1 to 9 clusters"},
		{"bad name", []ClusterSpec{{Name: "Alpha", PodCIDR: "10.244.0.0/16"}}, `Name "Alpha"`},
		{"long name", []ClusterSpec{{Name: "abcdefghijklm", PodCIDR: "10.244.0.0/16"}}, `Name "abcdefghijklm"`},
		{"duplicate", []ClusterSpec{{Name: "a", PodCIDR: "10.244.0.0/16"}, {Name: "a", PodCIDR: "10.245.0.0/16"}}, "used twice"},
		{"ipv6 pods", []ClusterSpec{{Name: "a", PodCIDR: "fd00::/48"}}, `PodCIDR "fd00::/48"`},
		{"pod prefix too long", []ClusterSpec{{Name: "a", PodCIDR: "10.244.0.0/24"}}, `PodCIDR "10.244.0.0/24"`},
		{"unmasked", []ClusterSpec{{Name: "a", PodCIDR: "10.244.1.0/16"}}, `PodCIDR "10.244.1.0/16"`},
		{"overlap", []ClusterSpec{{Name: "a", PodCIDR: "10.96.0.0/12"}}, "overlaps"},
		{"pods on the Gateway pools", []ClusterSpec{{Name: "a", PodCIDR: "172.31.0.0/16"}}, `PodCIDR "172.31.0.0/16" overlaps the underlay and Gateway address pools 172.30.0.0/15`},
		{"services on the underlay", []ClusterSpec{{Name: "a", PodCIDR: "10.244.0.0/16", ServiceCIDR: "172.30.0.0/16"}}, `ServiceCIDR "172.30.0.0/16" overlaps`},
		{"too many nodes", []ClusterSpec{{Name: "a", PodCIDR: "10.244.0.0/23", Nodes: 3}}, "Nodes 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewPlan(tc.specs, "")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func testPlan(t *testing.T) *Plan {
	p, err := NewPlan(DefaultClusters("10.244.0.0/16", "10.245.0.0/16"), "")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNodeConflist(t *testing.T) {
	p := testPlan(t)
	c := p.Clusters[1]
	b, err := NodeConflist(c.Nodes[1], c, []json.RawMessage{json.RawMessage(`{"type":"aether-cni","socket":"/run/aether/cni.sock"}`)})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Golden(t, "conflist-beta-node2.json", b)
	for _, bad := range []string{`{"socket":"x"}`, `[1]`} {
		if _, err := NodeConflist(c.Nodes[0], c, []json.RawMessage{json.RawMessage(bad)}); err == nil {
			t.Errorf("extra plugin %s: no error", bad)
		}
	}
}

func TestSubnetEnv(t *testing.T) {
	p := testPlan(t)
	got := string(SubnetEnv(p.Clusters[0].Nodes[1], p.Clusters[0]))
	want := "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestPodResolvConf(t *testing.T) {
	dnsIP := netip.MustParseAddr("10.96.0.10")
	node := []byte("nameserver 10.96.0.10\nsearch example.internal\noptions timeout:2\n")
	one, two := "1", "2"
	for _, tc := range []struct {
		name string
		spec corev1.PodSpec
		want string
	}{
		{"default is ClusterFirst", corev1.PodSpec{},
			"nameserver 10.96.0.10\nsearch demo.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"},
		{"hostNetwork ClusterFirst falls back to Default", corev1.PodSpec{HostNetwork: true},
			"nameserver 10.96.0.10\nsearch example.internal\noptions timeout:2\n"},
		{"ClusterFirstWithHostNet", corev1.PodSpec{HostNetwork: true, DNSPolicy: corev1.DNSClusterFirstWithHostNet},
			"nameserver 10.96.0.10\nsearch demo.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"},
		{"None with dnsConfig", corev1.PodSpec{DNSPolicy: corev1.DNSNone, DNSConfig: &corev1.PodDNSConfig{
			Nameservers: []string{"1.2.3.4"}, Searches: []string{"a.b"}, Options: []corev1.PodDNSConfigOption{{Name: "edns0"}}}},
			"nameserver 1.2.3.4\nsearch a.b\noptions edns0\n"},
		{"dnsConfig merges", corev1.PodSpec{DNSConfig: &corev1.PodDNSConfig{
			Nameservers: []string{"10.96.0.10", "1.1.1.1", "2.2.2.2", "3.3.3.3"},
			Searches:    []string{"cluster.local", "x.y"},
			Options:     []corev1.PodDNSConfigOption{{Name: "ndots", Value: &one}, {Name: "attempts", Value: &two}}}},
			"nameserver 10.96.0.10\nnameserver 1.1.1.1\nnameserver 2.2.2.2\nsearch demo.svc.cluster.local svc.cluster.local cluster.local x.y\noptions ndots:1 attempts:2\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "p"}, Spec: tc.spec}
			got, err := PodResolvConf(pod, dnsIP, "cluster.local", node)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
	for _, spec := range []corev1.PodSpec{{DNSPolicy: corev1.DNSNone}, {DNSPolicy: "Bogus"}} {
		if _, err := PodResolvConf(&corev1.Pod{Spec: spec}, dnsIP, "cluster.local", node); err == nil {
			t.Errorf("policy %q: no error", spec.DNSPolicy)
		}
	}
}

func TestNsWrap(t *testing.T) {
	got := nsWrap("/tmp/aesub-1/netns/n1", [][2]string{{"/tmp/aesub-1/n1/etc/resolv.conf", "/etc/resolv.conf"}, {"/it's", "/x"}}, "pod-a", []string{"/bin/echo", "hi"})
	want := []string{"nsenter", "--net=/tmp/aesub-1/netns/n1", "--", "unshare", "--mount", "--propagation", "slave", "--uts", "--",
		"/bin/sh", "-c", "set -e\nmount --bind '/tmp/aesub-1/n1/etc/resolv.conf' '/etc/resolv.conf'\nmount --bind '/it'\\''s' '/x'\nhostname 'pod-a'\nexec \"$@\"",
		"sh", "/bin/echo", "hi"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestPickNode(t *testing.T) {
	node := func(name string, ready bool, labels map[string]string) *corev1.Node {
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}}}
	}
	onNode := func(n string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{NodeName: n}, Status: corev1.PodStatus{Phase: phase}}
	}
	nodes := []*corev1.Node{
		node("n2", true, map[string]string{"zone": "b"}),
		node("n1", true, map[string]string{"zone": "a"}),
		node("n3", false, map[string]string{"zone": "a"}),
	}
	for _, tc := range []struct {
		name     string
		selector map[string]string
		pods     []*corev1.Pod
		want     string
		ok       bool
	}{
		{"empty cluster: first by name", nil, nil, "n1", true},
		{"least loaded", nil, []*corev1.Pod{onNode("n1", corev1.PodRunning)}, "n2", true},
		{"terminated pods do not count", nil, []*corev1.Pod{onNode("n1", corev1.PodSucceeded)}, "n1", true},
		{"selector", map[string]string{"zone": "b"}, nil, "n2", true},
		{"selector matches only a NotReady node", map[string]string{"zone": "a", "x": "y"}, nil, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{NodeSelector: tc.selector}}
			got, ok := pickNode(pod, nodes, tc.pods)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %q %v, want %q %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
