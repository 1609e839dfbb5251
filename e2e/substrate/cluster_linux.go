//go:build linux

package substrate

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// setupCluster prepares one cluster once its API server answers: clients, forwarders from the
// cluster's gateway to the API server and the registry, Node objects, node files, the stand-ins
// for the ServiceAccount controller and the scheduler, the kube-dns Service and the stub DNS.
func (s *Substrate) setupCluster(ctx, bgctx context.Context, c *Cluster, cniBinDir string) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return fmt.Errorf("set up %s: %w", c.Name, err)
	}
	c.Client = cs
	apiAddr := strings.TrimPrefix(c.Config.Host, "https://")
	gw := c.Plan.Gateway.String()
	if err := s.fwd.Listen(s.Underlay, net.JoinHostPort(gw, strconv.Itoa(APIServerPort)), apiAddr); err != nil {
		return err
	}
	if err := s.fwd.Listen(s.Underlay, net.JoinHostPort(gw, strconv.Itoa(RegistryPort)), strings.TrimPrefix(s.RegistryEndpoint, "https://")); err != nil {
		return err
	}
	c.NodeRegistryEndpoint = "https://" + net.JoinHostPort(gw, strconv.Itoa(RegistryPort))
	if s.images != nil {
		// Real nodes pull images from the substrate's registry here.
		if err := s.fwd.Listen(s.Underlay, net.JoinHostPort(gw, strconv.Itoa(ImageRegistryPort)), s.images.Addr()); err != nil {
			return err
		}
	}
	c.RegistryCAFile = s.RegistryCAFile
	c.NodeKubeconfig = filepath.Join(s.Dir, c.Name, "node-kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters[c.Name] = &clientcmdapi.Cluster{
		Server: "https://" + net.JoinHostPort(gw, strconv.Itoa(APIServerPort)), TLSServerName: "localhost",
		CertificateAuthorityData: c.Config.CAData,
	}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: c.Config.CertData, ClientKeyData: c.Config.KeyData}
	kc.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: "admin"}
	kc.CurrentContext = c.Name
	if err := clientcmd.WriteToFile(*kc, c.NodeKubeconfig); err != nil {
		return fmt.Errorf("write node kubeconfig of %s: %w", c.Name, err)
	}
	for _, n := range c.Nodes {
		if err := s.writeNodeFiles(n, cniBinDir); err != nil {
			return err
		}
		if err := createNodeObject(ctx, cs, n, !s.opts.RealNodes); err != nil {
			return err
		}
	}
	if s.opts.RealNodes {
		// kube-controller-manager, kube-scheduler and CoreDNS do the stand-ins' work.
		if err := createKubeDNSService(ctx, cs, c.Plan.DNSIP); err != nil {
			return fmt.Errorf("set up %s: %w", c.Name, err)
		}
		return nil
	}
	f := informers.NewSharedInformerFactory(cs, 0)
	c.svcLst = f.Core().V1().Services().Lister()
	c.podLst = f.Core().V1().Pods().Lister()
	nsInf := f.Core().V1().Namespaces().Informer()
	_, _ = nsInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
		ns := obj.(*corev1.Namespace)
		_, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(bgctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) && bgctx.Err() == nil {
			s.log.Warn("create default ServiceAccount", "cluster", c.Name, "namespace", ns.Name, "err", err)
		}
	}})
	nodeLst := f.Core().V1().Nodes().Lister()
	schedule := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil {
			return
		}
		nodes, _ := nodeLst.List(labels.Everything())
		pods, _ := c.podLst.List(labels.Everything())
		node, ok := pickNode(pod, nodes, pods)
		if !ok {
			s.log.Warn("no node fits pod", "cluster", c.Name, "pod", pod.Namespace+"/"+pod.Name)
			return
		}
		err := cs.CoreV1().Pods(pod.Namespace).Bind(bgctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: node},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) && bgctx.Err() == nil {
			s.log.Warn("bind pod", "cluster", c.Name, "pod", pod.Namespace+"/"+pod.Name, "err", err)
		}
	}
	_, _ = f.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: schedule, UpdateFunc: func(_, o any) { schedule(o) },
	})
	f.Start(bgctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("set up %s: informer for %v did not sync", c.Name, typ)
		}
	}
	s.bg.Go(func() { <-bgctx.Done(); f.Shutdown() })
	if err := createKubeDNSService(ctx, cs, c.Plan.DNSIP); err != nil {
		return fmt.Errorf("set up %s: %w", c.Name, err)
	}
	return s.startDNS(c)
}

// writeNodeFiles lays out the node's root: the conflist, the CNI binaries (symlinks to the cache
// and to CNIBinaries), subnet.env, resolv.conf and the empty agent directories. It also makes sure
// the bind targets exist in the root filesystem (empty directories; nothing is mounted there in
// the root mount namespace).
func (s *Substrate) writeNodeFiles(n *Node, cniBinDir string) error {
	for _, d := range nodeDirs {
		if err := os.MkdirAll(n.hostPath(d), 0o755); err != nil {
			return fmt.Errorf("write files of %s: %w", n.Name, err)
		}
		if d == "/dev/shm" {
			if err := os.Chmod(n.hostPath(d), 0o1777); err != nil {
				return fmt.Errorf("write files of %s: %w", n.Name, err)
			}
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create bind target %s: %w", d, err)
		}
	}
	conf, err := NodeConflist(n.Plan, n.Cluster.Plan, s.opts.CNIPlugins)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		n.hostPath("/etc/cni/net.d/" + ConflistFile): conf,
		n.hostPath("/run/flannel/subnet.env"):        SubnetEnv(n.Plan, n.Cluster.Plan),
		n.hostPath("/etc/resolv.conf"):               NodeResolvConf(n.Cluster.Plan.DNSIP),
	}
	if err := writeFiles(files); err != nil {
		return fmt.Errorf("write files of %s: %w", n.Name, err)
	}
	bins := []string{}
	for _, b := range []string{"bridge", "host-local", "loopback", "portmap"} {
		bins = append(bins, filepath.Join(cniBinDir, b))
	}
	for _, b := range append(bins, s.opts.CNIBinaries...) {
		abs, err := filepath.Abs(b)
		if err != nil {
			return err
		}
		if err := os.Symlink(abs, n.hostPath("/opt/cni/bin/"+filepath.Base(b))); err != nil {
			return fmt.Errorf("install CNI binary %s on %s: %w", b, n.Name, err)
		}
	}
	return nil
}

// createNodeObject registers the node: spec.podCIDR(s) = its Flannel subnet, Flannel's node
// annotations (vxlan backend data with the VTEP MAC, public IP) and, with status (the kubelet
// stand-in's nodes; a real kubelet reports its own), status addresses InternalIP and Hostname,
// capacity and a Ready condition.
func createNodeObject(ctx context.Context, cs kubernetes.Interface, n *Node, status bool) error {
	backend, _ := json.Marshal(map[string]any{"VNI": FlannelVNI, "VtepMAC": n.Plan.VtepMAC.String()})
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name,
			Labels: map[string]string{
				"kubernetes.io/hostname": n.Name, "kubernetes.io/os": "linux",
				"topology.kubernetes.io/region": n.Cluster.Name, "topology.kubernetes.io/zone": n.Name,
			},
			Annotations: map[string]string{
				"flannel.alpha.coreos.com/backend-type":        "vxlan",
				"flannel.alpha.coreos.com/backend-data":        string(backend),
				"flannel.alpha.coreos.com/public-ip":           n.Plan.IP.String(),
				"flannel.alpha.coreos.com/kube-subnet-manager": "true",
			},
		},
		Spec: corev1.NodeSpec{PodCIDR: n.Plan.PodSubnet.String(), PodCIDRs: []string{n.Plan.PodSubnet.String()}},
	}
	created, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Node %s: %w", n.Name, err)
	}
	if !status {
		return nil
	}
	now := metav1.Now()
	created.Status = corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.Plan.IP.String()}, {Type: corev1.NodeHostName, Address: n.Name}},
		Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"), corev1.ResourcePods: resource.MustParse("110"),
		},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}},
		NodeInfo:   corev1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64", KubeletVersion: "substrate"},
	}
	created.Status.Allocatable = created.Status.Capacity
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status of Node %s: %w", n.Name, err)
	}
	return nil
}

// createKubeDNSService creates kube-system/kube-dns with the stub's VIP as ClusterIP (ports 53
// UDP and TCP, label k8s-app=kube-dns), so that whoever looks for the cluster DNS Service finds
// it as in a kubeadm or kind cluster.
func createKubeDNSService(ctx context.Context, cs kubernetes.Interface, ip netip.Addr) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: corev1.ServiceSpec{
			ClusterIP: ip.String(),
			Selector:  map[string]string{"k8s-app": "kube-dns"},
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP},
			},
		},
	}
	if _, err := cs.CoreV1().Services("kube-system").Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create kube-dns Service: %w", err)
	}
	return nil
}

// Domain is the cluster's DNS domain (the kubelet's clusterDomain: Options.ClusterDomain, by
// default cluster.local), valid from the Cluster hook on.
func (c *Cluster) Domain() string { return c.s.Plan.ClusterDomain }

// service and selectedPodIPs make Cluster a clusterView for the stub kube-dns.
func (c *Cluster) service(ns, name string) (*corev1.Service, bool) {
	svc, err := c.svcLst.Services(ns).Get(name)
	return svc, err == nil
}

func (c *Cluster) selectedPodIPs(ns string, selector map[string]string) []netip.Addr {
	if len(selector) == 0 {
		return nil
	}
	pods, _ := c.podLst.Pods(ns).List(labels.SelectorFromSet(selector))
	var out []netip.Addr
	for _, p := range pods {
		ready := false
		for _, cond := range p.Status.Conditions {
			ready = ready || (cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue)
		}
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil && ready && p.DeletionTimestamp == nil {
			out = append(out, a)
		}
	}
	return out
}

// startDNS serves the cluster's stub kube-dns on <DNSIP>:53 (UDP and TCP) in every node
// namespace, where the VIP sits on lo: pods reach it through their default route to
// the node, node processes directly.
func (s *Substrate) startDNS(c *Cluster) error {
	zone := dns.Fqdn(s.Plan.ClusterDomain)
	h := &stubDNS{zone: zone, lookup: func(name string) ([]netip.Addr, bool) {
		return lookupCluster(name, zone, c, s.opts.StaticDNS)
	}}
	addr := net.JoinHostPort(c.Plan.DNSIP.String(), "53")
	for _, n := range c.Nodes {
		tl, err := listenIn(n.Netns, addr)
		if err != nil {
			return fmt.Errorf("listen for DNS in %s: %w", n.Name, err)
		}
		pc, err := listenPacketIn(n.Netns, addr)
		if err != nil {
			tl.Close()
			return fmt.Errorf("listen for DNS in %s: %w", n.Name, err)
		}
		for _, srv := range []*dns.Server{
			{Listener: tl, Net: "tcp", ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second},
			{PacketConn: pc, Net: "udp", ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second},
		} {
			mux := dns.NewServeMux()
			mux.Handle(".", h)
			srv.Handler = mux
			started := make(chan struct{})
			srv.NotifyStartedFunc = func() { close(started) }
			c.dns = append(c.dns, srv)
			s.bg.Go(func() { _ = srv.ActivateAndServe() })
			<-started
		}
	}
	return nil
}

// CreateNamespace creates a namespace with labels and waits (until ctx ends) for its default
// ServiceAccount, which the substrate's stand-in for the ServiceAccount controller makes and
// without which the API server refuses pods.
func (c *Cluster) CreateNamespace(ctx context.Context, name string, labels map[string]string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s in %s: %w", name, c.Name, err)
	}
	for {
		if _, err := c.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create namespace %s in %s: no default ServiceAccount: %w", name, c.Name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitPodReady polls until the pod has condition Ready=True and returns it; it fails when ctx
// ends or the pod terminates.
func (c *Cluster) WaitPodReady(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	var last string
	for {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					return p, nil
				}
			}
			if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
				return p, fmt.Errorf("wait for pod %s/%s in %s: it terminated (%s)", ns, name, c.Name, p.Status.Phase)
			}
			last = fmt.Sprintf("phase %s %s %s", p.Status.Phase, p.Status.Reason, p.Status.Message)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for pod %s/%s in %s to be Ready: %s: %w", ns, name, c.Name, last, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitPodGone polls until the pod object no longer exists.
func (c *Cluster) WaitPodGone(ctx context.Context, ns, name string) error {
	for {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for pod %s/%s in %s to go: %w", ns, name, c.Name, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
