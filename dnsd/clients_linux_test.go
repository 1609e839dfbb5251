//go:build linux

package dnsd

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// Addresses inside the test's own namespaces.
const (
	nodeIP    = "10.77.0.1" // the resolver's HOST_IP, in the "node" namespace
	podIP     = "10.77.0.2" // the client pod, in the "pod" namespace
	kubeDNSIP = "10.96.0.10"
)

// podResolvConf is what the kubelet writes for a pod in namespace shop (ClusterFirst) in a
// cluster whose clusterDomain is domain.
func podResolvConf(domain string) string {
	return "search shop.svc." + domain + " svc." + domain + " " + domain + "\nnameserver " + kubeDNSIP + "\noptions ndots:5\n"
}

// dnatRules DNATs the pod's DNS to the cluster DNS service to the agent's resolver, as the
// capture rules do (DESIGN.md, data flow 2), in the pod namespace's own nftables.
const dnatRules = `table ip aether_dns_test {
	chain output {
		type nat hook output priority -100; policy accept;
		ip daddr ` + kubeDNSIP + ` udp dport 53 dnat to ` + nodeIP + `:18054
		ip daddr ` + kubeDNSIP + ` tcp dport 53 dnat to ` + nodeIP + `:18054
	}
}
`

// podTopology is a node namespace running the resolver and a pod namespace, joined by a veth
// pair, whose DNS is DNAT'ed to the resolver and whose resolv.conf is the kubelet's.
type podTopology struct {
	node, pod *testenv.Netns
	reg       *prometheus.Registry
	upstream  *stub
	// exampleA counts the A queries for example.org. that reached the upstream.
	exampleA *atomic.Int64
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newPodTopology builds the topology for a cluster whose clusterDomain is domain: the pod's
// resolv.conf searches under it and the resolver is told it (IndexOptions.ClusterDomain).
func newPodTopology(t *testing.T, domain string) *podTopology {
	t.Helper()
	node, pod := testenv.NewNetns(t), testenv.NewNetns(t)
	run(t, "ip", "-n", node.Name, "link", "add", "vn", "type", "veth", "peer", "name", "vp", "netns", pod.Name)
	run(t, "ip", "-n", node.Name, "addr", "add", nodeIP+"/24", "dev", "vn")
	run(t, "ip", "-n", node.Name, "link", "set", "vn", "up")
	run(t, "ip", "-n", pod.Name, "addr", "add", podIP+"/24", "dev", "vp")
	run(t, "ip", "-n", pod.Name, "link", "set", "vp", "up")
	run(t, "ip", "-n", pod.Name, "route", "add", "default", "via", nodeIP)
	// A dual-stack pod: glibc's getaddrinfo (AI_ADDRCONFIG in getent ahosts) asks AAAA only
	// when the pod has a global IPv6 address; in an IPv4-only pod it sends the A query alone.
	run(t, "ip", "-n", node.Name, "addr", "add", "fd77::1/64", "dev", "vn", "nodad")
	run(t, "ip", "-n", pod.Name, "addr", "add", "fd77::2/64", "dev", "vp", "nodad")
	cmd := exec.Command("ip", "netns", "exec", pod.Name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(dnatRules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in pod netns: %v\n%s", err, out)
	}
	// ip netns exec bind-mounts /etc/netns/<name>/* over /etc/*.
	dir := filepath.Join("/etc/netns", pod.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(dir)
		os.Remove("/etc/netns") // only when empty (other tests may use it)
	})
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(podResolvConf(domain)), 0o644); err != nil {
		t.Fatal(err)
	}

	// kube-dns: a stub on the root namespace's loopback, where the resolver's forwarding
	// sockets live (only its listening sockets are opened in the node namespace).
	exampleA := new(atomic.Int64)
	up := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
		if q := r.Question[0]; q.Name == "example.org." && q.Qtype == dns.TypeA {
			exampleA.Add(1)
		}
		answerA(1)(w, r)
	})
	fwd, err := NewForwarder([]string{up.addr}, ForwarderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	// The agent's default cache: every client's lookups of the forwarded name after the first
	// are answered from it. Its clock stands still, so no entry expires during the test however
	// slow the machine.
	res, err := NewResolver(fwd, ResolverOptions{Registerer: reg, Index: IndexOptions{ClusterDomain: domain},
		Cache: CacheOptions{Size: DefaultCacheSize, clock: func() int64 { return 0 }}})
	if err != nil {
		t.Fatal(err)
	}
	m := testMesh()
	// The client pod of namespace shop has podIP.
	m.Pods[1].IPs[0] = mustAddr(podIP)
	m = model.New(m.Version, m.Cluster, m.MeshDomain, m.TrustDomain, m.Node, m.Services, m.Endpoints, m.Pods)
	if err := res.Update(m); err != nil {
		t.Fatal(err)
	}
	var pc net.PacketConn
	var l net.Listener
	err = node.Do(func() error {
		var err error
		addr := net.JoinHostPort(nodeIP, fmt.Sprint(DefaultPort))
		if pc, err = net.ListenPacket("udp", addr); err != nil {
			return err
		}
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(res, ServerConfig{PacketConn: pc, Listener: l})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return &podTopology{node: node, pod: pod, reg: reg, upstream: up, exampleA: exampleA}
}

func (p *podTopology) queries(t *testing.T) int {
	return int(metricSum(t, p.reg, MetricQueries, nil))
}

// lookupClient resolves one name from inside the pod namespace and returns the addresses.
type lookupClient struct {
	name   string
	lookup func(t *testing.T, p *podTopology, name string) []string
}

// TestPrivilegedClientsThroughDNAT resolves mesh, clusterset and forwarded names from a pod
// namespace whose DNS to the cluster DNS service is DNAT'ed to the resolver, with the pod's
// default resolv.conf (ndots:5, the three Kubernetes search domains), with four clients: the
// miekg/dns client, Go's resolver, glibc (getent ahosts) and musl (getaddrinfo, static). It
// reports how many queries each client sends per lookup; mesh names take one query per address
// family, the first search-list expansion being answered directly.
func TestPrivilegedClientsThroughDNAT(t *testing.T) {
	testenv.RequireRoot(t)
	musl := filepath.Join(t.TempDir(), "lookup-musl")
	if out, err := exec.Command("musl-gcc", "-static", "-O2", "-o", musl, "testdata/lookup.c").CombinedOutput(); err != nil {
		t.Fatalf("musl-gcc (Debian musl-tools): %v\n%s", err, out)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The second domain is a cluster whose kubelet's clusterDomain is not cluster.local
	// (aether-agent --cluster-domain, or read from its resolv.conf).
	for _, domain := range []string{"cluster.local", "corp.example"} {
		t.Run(domain, func(t *testing.T) {
			p := newPodTopology(t, domain)

			clients := []lookupClient{
				{name: "miekg/dns udp", lookup: miekgLookup("udp")},
				{name: "miekg/dns tcp", lookup: miekgLookup("tcp")},
				{name: "go", lookup: func(t *testing.T, p *podTopology, name string) []string {
					cmd := p.pod.Command(self, "-test.run=^$")
					cmd.Env = append(os.Environ(), "DNSD_GO_LOOKUP="+name, "GODEBUG=netdns=go")
					return lines(t, cmd)
				}},
				{name: "glibc getent ahosts", lookup: func(t *testing.T, p *podTopology, name string) []string {
					var out []string
					for _, l := range lines(t, p.pod.Command("getent", "ahosts", name)) {
						if f := strings.Fields(l); len(f) >= 2 && f[1] == "STREAM" {
							out = append(out, f[0])
						}
					}
					return out
				}},
				{name: "musl getaddrinfo", lookup: func(t *testing.T, p *podTopology, name string) []string {
					var out []string
					for _, l := range lines(t, p.pod.Command(musl, name)) {
						if !strings.HasPrefix(l, "canonical ") {
							out = append(out, l)
						}
					}
					return out
				}},
			}
			names := []struct {
				name string
				want []string // addresses (each client asks what it asks: miekg A only)
				mesh bool     // answered by the resolver itself
			}{
				{name: "web.mesh", want: []string{"10.96.0.20", "fd00::20"}, mesh: true},
				{name: "cart.shop.mesh", want: []string{"10.96.1.30"}, mesh: true},
				{name: "cart.shop.svc.clusterset.local", want: []string{"10.97.0.30"}, mesh: true},
				{name: "example.org", want: []string{"192.0.2.1"}},
			}
			var report []string
			for _, c := range clients {
				for _, n := range names {
					t.Run(c.name+"/"+n.name, func(t *testing.T) {
						before := p.queries(t)
						got := c.lookup(t, p, n.name)
						sent := p.queries(t) - before
						slices.Sort(got)
						got = slices.Compact(got)
						want := n.want
						if strings.HasPrefix(c.name, "miekg/dns") {
							want = want[:1]
						}
						if !slices.Equal(got, want) {
							t.Errorf("%s resolved %s to %v, want %v", c.name, n.name, got, want)
						}
						report = append(report, fmt.Sprintf("%-20s %-32s %d queries", c.name, n.name, sent))
						if n.mesh {
							families := 2
							if strings.HasPrefix(c.name, "miekg/dns") {
								families = 1
							}
							if sent != families {
								t.Errorf("%s sent %d queries for %s, want %d (one per address family: first expansion answered)", c.name, sent, n.name, families)
							}
						}
					})
				}
			}
			// SRV lookups with Go's resolver (net.LookupSRV, which walks the search list like
			// LookupHost): the first expansion is answered (a CNAME to the SRV name, then its
			// records), so each takes one query.
			for _, q := range []struct {
				args string
				want []string
			}{
				{"http tcp web.mesh", []string{"web.mesh. 80"}},
				{"dns udp pay.remote.svc.clusterset.local", []string{"pay.remote.svc.clusterset.local. 53"}},
				{"pg tcp db.mesh", []string{"db-0.db.default.mesh. 5432", "db-1.db.default.mesh. 5433", "db-6.db.default.mesh. 5432"}},
			} {
				t.Run("go SRV/"+q.args, func(t *testing.T) {
					before := p.queries(t)
					cmd := p.pod.Command(self, "-test.run=^$")
					cmd.Env = append(os.Environ(), "DNSD_GO_SRV="+q.args, "GODEBUG=netdns=go")
					got := lines(t, cmd)
					sent := p.queries(t) - before
					slices.Sort(got)
					if !slices.Equal(got, q.want) {
						t.Errorf("LookupSRV %s = %q, want %q", q.args, got, q.want)
					}
					if sent != 1 {
						t.Errorf("LookupSRV %s sent %d queries, want 1 (first expansion answered)", q.args, sent)
					}
					report = append(report, fmt.Sprintf("%-20s %-32s %d queries", "go SRV", q.args, sent))
				})
			}
			t.Logf("queries per lookup (pod resolv.conf ndots:5, search shop.svc.%[1]s svc.%[1]s %[1]s):\n%[2]s", domain, strings.Join(report, "\n"))
			// The cache (30 s, TTL 30) answered every client's A lookup of example.org after
			// the first, whatever the client and transport.
			if n := p.exampleA.Load(); n != 1 {
				t.Errorf("upstream got %d A queries for example.org., want 1 (the rest answered from the cache)", n)
			}
		})
	}
}

// miekgLookup asks one A query with the miekg/dns client over netw from inside the pod
// namespace (the socket is created on a thread in that namespace).
func miekgLookup(netw string) func(t *testing.T, p *podTopology, name string) []string {
	return func(t *testing.T, p *podTopology, name string) []string {
		var out []string
		err := p.pod.Do(func() error {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(name), dns.TypeA)
			c := &dns.Client{Net: netw, Timeout: 10 * time.Second}
			resp, _, err := c.Exchange(m, net.JoinHostPort(kubeDNSIP, "53"))
			if err != nil {
				return err
			}
			for _, rr := range resp.Answer {
				if a, ok := rr.(*dns.A); ok {
					out = append(out, a.A.String())
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("miekg %s lookup %s: %v", netw, name, err)
		}
		return out
	}
}

func lines(t *testing.T, cmd *exec.Cmd) []string {
	t.Helper()
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%s: %v\n%s%s", strings.Join(cmd.Args, " "), err, out, stderr)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
