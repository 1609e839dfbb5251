package substrate

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ConflistName is the network name of every node's conflist, as kube-flannel's 10-flannel.conflist
// names it; ConflistFile is its file name in the node's /etc/cni/net.d.
const (
	ConflistName = "cbr0"
	ConflistFile = "10-flannel.conflist"
	// CNIVersion is the CNI spec version of the conflist (CNI spec 1.1).
	CNIVersion = "1.1.0"
)

// NodeConflist builds the node's conflist: first the bridge + host-local configuration Flannel's
// CNI plugin delegates to (kube-flannel's delegate: bridge cni0, isGateway, isDefaultGateway,
// hairpinMode, ipMasq false because flanneld masquerades, mtu from subnet.env, host-local on the
// node's subnet with a route to the whole cluster network), then extra (aether-cni's entry once it
// exists), in that order. Each extra entry must be a JSON object with a "type".
func NodeConflist(node NodePlan, cluster ClusterPlan, extra []json.RawMessage) ([]byte, error) {
	bridge := map[string]any{
		"type":             "bridge",
		"bridge":           "cni0",
		"isGateway":        true,
		"isDefaultGateway": true,
		"ipMasq":           false,
		"hairpinMode":      true,
		"mtu":              FlannelMTU,
		"ipam": map[string]any{
			"type":   "host-local",
			"ranges": [][]map[string]string{{{"subnet": node.PodSubnet.String()}}},
			"routes": []map[string]string{{"dst": cluster.PodCIDR.String()}},
		},
	}
	plugins := []any{bridge}
	for i, e := range extra {
		var m map[string]any
		if err := json.Unmarshal(e, &m); err != nil {
			return nil, fmt.Errorf("build conflist: CNIPlugins[%d]: %w", i, err)
		}
		if t, _ := m["type"].(string); t == "" {
			return nil, fmt.Errorf("build conflist: CNIPlugins[%d]: no \"type\"", i)
		}
		plugins = append(plugins, m)
	}
	b, err := json.MarshalIndent(map[string]any{
		"cniVersion": CNIVersion,
		"name":       ConflistName,
		"plugins":    plugins,
	}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("build conflist: %w", err)
	}
	return append(b, '\n'), nil
}

// SubnetEnv builds the /run/flannel/subnet.env flanneld writes for a node (the file Flannel's CNI
// plugin reads): the cluster network, the node's subnet with the bridge gateway as address, the
// vxlan MTU and ip-masq on.
func SubnetEnv(node NodePlan, cluster ClusterPlan) []byte {
	return fmt.Appendf(nil, "FLANNEL_NETWORK=%s\nFLANNEL_SUBNET=%s/%d\nFLANNEL_MTU=%d\nFLANNEL_IPMASQ=true\n",
		cluster.PodCIDR, node.BridgeGateway(), node.PodSubnet.Bits(), FlannelMTU)
}

// NodeResolvConf is the node's /etc/resolv.conf: the cluster's stub kube-dns only, so nothing a
// node process resolves ever leaves the machine.
func NodeResolvConf(dnsIP netip.Addr) []byte {
	return fmt.Appendf(nil, "nameserver %s\n", dnsIP)
}

// PodResolvConf builds a pod's resolv.conf the way the kubelet does from spec.dnsPolicy and
// spec.dnsConfig (Kubernetes "DNS for Services and Pods", Pod's DNS policy): ClusterFirst (the
// default; Default for hostNetwork pods) and ClusterFirstWithHostNet use the cluster DNS with the
// search list <ns>.svc.<domain> svc.<domain> <domain> and ndots:5; Default copies the node's
// file; None starts empty. dnsConfig's nameservers and searches are then appended (duplicates
// dropped, at most 3 nameservers and 32 searches) and its options override by name.
func PodResolvConf(pod *corev1.Pod, dnsIP netip.Addr, clusterDomain string, nodeResolv []byte) ([]byte, error) {
	var servers, searches []string
	var opts []corev1.PodDNSConfigOption
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst
	}
	if policy == corev1.DNSClusterFirst && pod.Spec.HostNetwork {
		policy = corev1.DNSDefault
	}
	switch policy {
	case corev1.DNSClusterFirst, corev1.DNSClusterFirstWithHostNet:
		servers = []string{dnsIP.String()}
		searches = []string{pod.Namespace + ".svc." + clusterDomain, "svc." + clusterDomain, clusterDomain}
		five := "5"
		opts = []corev1.PodDNSConfigOption{{Name: "ndots", Value: &five}}
	case corev1.DNSDefault:
		servers, searches, opts = parseResolvConf(nodeResolv)
	case corev1.DNSNone:
		if pod.Spec.DNSConfig == nil {
			return nil, fmt.Errorf("build resolv.conf: pod %s/%s: spec.dnsPolicy None needs spec.dnsConfig", pod.Namespace, pod.Name)
		}
	default:
		return nil, fmt.Errorf("build resolv.conf: pod %s/%s: spec.dnsPolicy %q is not supported", pod.Namespace, pod.Name, policy)
	}
	if c := pod.Spec.DNSConfig; c != nil {
		servers = appendNew(servers, c.Nameservers...)
		searches = appendNew(searches, c.Searches...)
		for _, o := range c.Options {
			i := slices.IndexFunc(opts, func(x corev1.PodDNSConfigOption) bool { return x.Name == o.Name })
			if i >= 0 {
				opts[i] = o
			} else {
				opts = append(opts, o)
			}
		}
	}
	if len(servers) > 3 {
		servers = servers[:3]
	}
	if len(searches) > 32 {
		searches = searches[:32]
	}
	var b strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if len(searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(searches, " "))
	}
	if len(opts) > 0 {
		var os []string
		for _, o := range opts {
			if o.Value != nil {
				os = append(os, o.Name+":"+*o.Value)
			} else {
				os = append(os, o.Name)
			}
		}
		fmt.Fprintf(&b, "options %s\n", strings.Join(os, " "))
	}
	return []byte(b.String()), nil
}

func appendNew(list []string, add ...string) []string {
	for _, a := range add {
		if !slices.Contains(list, a) {
			list = append(list, a)
		}
	}
	return list
}

// parseResolvConf reads nameserver, search and options lines of a resolv.conf.
func parseResolvConf(b []byte) (servers, searches []string, opts []corev1.PodDNSConfigOption) {
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			servers = appendNew(servers, f[1])
		case "search":
			searches = appendNew(searches, f[1:]...)
		case "options":
			for _, o := range f[1:] {
				name, val, ok := strings.Cut(o, ":")
				opt := corev1.PodDNSConfigOption{Name: name}
				if ok {
					opt.Value = &val
				}
				opts = append(opts, opt)
			}
		}
	}
	return servers, searches, opts
}
