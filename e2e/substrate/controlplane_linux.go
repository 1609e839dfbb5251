//go:build linux

package substrate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/aethermesh/aether/images"
	"github.com/aethermesh/aether/internal/testenv"
)

// ImageRegistryPort is where the substrate's image registry listens on every cluster's
// underlay gateway (real nodes pull from http://<gateway>:5000).
const ImageRegistryPort = 5000

// egressProxy is the API servers' way to their kubelets. The API servers run on the root
// namespace's loopback and the nodes live behind the underlay, which the root namespace has no
// route to; as with Konnectivity on managed clusters, each API server sends its "cluster"
// egress (exec, logs, port-forward, proxy to nodes) through an HTTP CONNECT proxy
// (apiserver.k8s.io/v1beta1 EgressSelectorConfiguration, transport uds). The substrate serves it
// on a unix socket and dials inside the underlay, only to node addresses of the plan.
type egressProxy struct {
	srv     *http.Server
	allowed func(netip.Addr) bool
	dial    func(ctx context.Context, addr string) (net.Conn, error)
}

func (p *egressProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "only CONNECT", http.StatusMethodNotAllowed)
		return
	}
	ap, err := netip.ParseAddrPort(r.Host)
	if err != nil || !p.allowed(ap.Addr()) {
		http.Error(w, fmt.Sprintf("egress to %q refused: not a node address of the substrate", r.Host), http.StatusForbidden)
		return
	}
	up, err := p.dial(r.Context(), r.Host)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "no hijack", http.StatusInternalServerError)
		return
	}
	down, buf, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	_, _ = down.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
	go func() {
		// Bytes the client sent after the CONNECT request are already in buf.
		_, _ = io.Copy(up, io.MultiReader(buf.Reader, down))
		if tc, ok := up.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	_, _ = io.Copy(down, up)
	up.Close()
	down.Close()
}

// startEgressProxy serves the egress proxy at <Dir>/egress.sock and writes the API servers'
// egress selector configuration; it returns the configuration's path.
func (s *Substrate) startEgressProxy() (string, error) {
	sock := filepath.Join(s.Dir, "egress.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		return "", fmt.Errorf("egress proxy: %w", err)
	}
	p := &egressProxy{
		allowed: func(a netip.Addr) bool {
			for _, c := range s.Plan.Clusters {
				for _, n := range c.Nodes {
					if n.IP == a {
						return true
					}
				}
			}
			return false
		},
		dial: func(ctx context.Context, addr string) (net.Conn, error) {
			if s.Underlay == nil {
				return nil, errors.New("underlay not up yet")
			}
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return dialIn(ctx, s.Underlay, "tcp", addr)
		},
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	s.egress = p
	s.bg.Go(func() { _ = p.srv.Serve(l) })
	cfg := filepath.Join(s.Dir, "egress-selector.yaml")
	err = os.WriteFile(cfg, fmt.Appendf(nil, `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
  - name: cluster
    connection:
      proxyProtocol: HTTPConnect
      transport:
        uds:
          udsName: %s
`, sock), 0o644)
	return cfg, err
}

// realAPIServerArgs are the kube-apiserver flags real nodes need besides the Node authorizer and
// the kubelet client certificate (testenv options): the egress proxy, kubelets reached at their
// InternalIP (nothing resolves node names) and the NodeRestriction admission plugin (each
// kubelet its own identity).
func realAPIServerArgs(egressConfig string) []string {
	return []string{
		"--egress-selector-config-file", egressConfig,
		"--kubelet-preferred-address-types", "InternalIP",
		"--enable-admission-plugins", "NodeRestriction",
	}
}

// startImageRegistry serves the substrate's OCI registry (images.ServeRegistry, blobs under
// <Dir>/images) on the root namespace's loopback, where PushImage writes; the nodes' containerd
// pulls from it through a forwarder on every cluster's gateway (:ImageRegistryPort).
func (s *Substrate) startImageRegistry() error {
	dir := filepath.Join(s.Dir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("image registry: %w", err)
	}
	s.images = images.ServeRegistry(l, dir, s.log)
	return nil
}

// PushImage stores img in the substrate's registry under ref (a reference as a manifest names
// it: images.LocalReference says where), so that every real node can pull ref.
func (s *Substrate) PushImage(ctx context.Context, ref string, img v1.Image) error {
	return s.PushImages(ctx, []images.Built{{Ref: ref, Image: img}})
}

// PushImages stores built images (images.Build) in the substrate's registry.
func (s *Substrate) PushImages(ctx context.Context, imgs []images.Built) error {
	if s.images == nil {
		return errors.New("push images: the substrate has no image registry (Options.RealNodes is off)")
	}
	return images.Push(ctx, s.images.Addr(), imgs)
}

// startControlPlane starts the cluster's kube-controller-manager and kube-scheduler (root
// namespaces, admin kubeconfig, loopback to the API server), points the kubernetes Service at the
// API server's forwarder on the gateway, and deploys CoreDNS as kube-dns.
func (s *Substrate) startControlPlane(ctx context.Context, c *Cluster, tl testenv.Tools) error {
	d := c.API.Dir
	if _, err := c.Start("kube-controller-manager", []string{filepath.Join(tl.KubernetesDir, "kube-controller-manager"),
		"--kubeconfig", c.Kubeconfig, "--root-ca-file", filepath.Join(d, "ca.crt"),
		"--service-account-private-key-file", filepath.Join(d, "sa.key"),
		"--cluster-name", c.Name, "--leader-elect=false", "--secure-port=0", "--controllers=*",
		"--use-service-account-credentials=false", "--v", "1"}, nil); err != nil {
		return err
	}
	if _, err := c.Start("kube-scheduler", []string{filepath.Join(tl.KubernetesDir, "kube-scheduler"),
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false", "--secure-port=0", "--v", "1"}, nil); err != nil {
		return err
	}
	if err := kubernetesEndpoints(ctx, c.Client, c.Plan.Gateway); err != nil {
		return fmt.Errorf("set up %s: %w", c.Name, err)
	}
	return deployCoreDNS(ctx, c)
}

// kubernetesEndpoints points default/kubernetes at the API server as pods reach it: the
// forwarder on the cluster's gateway, port 6443, in the EndpointSlice the API server's own
// endpoint reconciler would write (it is off: it would advertise loopback). kube-proxy and
// CoreDNS read EndpointSlices only.
func kubernetesEndpoints(ctx context.Context, cs kubernetes.Interface, gw netip.Addr) error {
	port := int32(APIServerPort)
	proto := corev1.ProtocolTCP
	pname := "https"
	ready := true
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes",
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: "aether-substrate"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{gw.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create kubernetes EndpointSlice: %w", err)
	}
	return nil
}

// CoreDNSImage is the CoreDNS image real nodes run as kube-dns (the cached coredns binary).
const CoreDNSImage = "aether-e2e/coredns:dev"

// coreDNSCorefile serves the cluster domain from the API (the kubernetes plugin), the substrate's
// static names (hosts), and answers NXDOMAIN for every other name: nothing leaves the machine.
func coreDNSCorefile(domain string, static map[string][]netip.Addr) string {
	var hosts strings.Builder
	for n, addrs := range static {
		for _, a := range addrs {
			fmt.Fprintf(&hosts, "      %s %s\n", a, strings.TrimSuffix(n, "."))
		}
	}
	hostsBlock := ""
	if hosts.Len() > 0 {
		hostsBlock = "    hosts {\n" + hosts.String() + "      fallthrough\n    }\n"
	}
	return fmt.Sprintf(`%s:53 in-addr.arpa:53 ip6.arpa:53 {
    errors
    health :8080
    ready :8181
%s    kubernetes %s in-addr.arpa ip6.arpa {
      pods insecure
      fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
.:53 {
    errors
    template ANY ANY {
      rcode NXDOMAIN
    }
}
`, domain, hostsBlock, domain)
}

// deployCoreDNS creates what kubeadm and kind run as kube-dns: the coredns ServiceAccount and
// its RBAC, the Corefile ConfigMap and a Deployment of two replicas labelled k8s-app=kube-dns
// (the kube-dns Service already selects them).
func deployCoreDNS(ctx context.Context, c *Cluster) error {
	cs := c.Client
	const ns = "kube-system"
	labels := map[string]string{"k8s-app": "kube-dns"}
	objs := []func() error{
		func() error {
			_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "coredns"}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
				Rules: []rbacv1.PolicyRule{
					{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
					{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
				},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
				RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:coredns"},
				Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "coredns", Namespace: ns}},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "coredns"},
				Data:       map[string]string{"Corefile": coreDNSCorefile(c.s.Plan.ClusterDomain, c.s.opts.StaticDNS)},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			replicas := int32(2)
			_, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Name: "coredns", Labels: labels},
				Spec: appsv1.DeploymentSpec{
					Replicas: &replicas,
					Selector: &metav1.LabelSelector{MatchLabels: labels},
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: labels},
						Spec: corev1.PodSpec{
							ServiceAccountName: "coredns",
							DNSPolicy:          corev1.DNSDefault,
							PriorityClassName:  "system-cluster-critical",
							Containers: []corev1.Container{{
								Name: "coredns", Image: CoreDNSImage, Args: []string{"-conf", "/etc/coredns/Corefile"},
								Ports: []corev1.ContainerPort{
									{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
									{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
								},
								ReadinessProbe: &corev1.Probe{
									ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8181)}},
									PeriodSeconds: 1,
								},
								VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
							}},
							Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
								ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "coredns"}},
							}}},
						},
					},
				},
			}, metav1.CreateOptions{})
			return err
		},
	}
	for _, create := range objs {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("deploy CoreDNS in %s: %w", c.Name, err)
		}
	}
	return nil
}

// execInPodAPI runs argv in the pod's container (its only one when container is "") through
// the API server's pods/exec (what kubectl exec does) and returns stdout; a failure returns an
// error holding stderr.
func (c *Cluster) execInPodAPI(ctx context.Context, ns, name, container string, argv []string) ([]byte, error) {
	req := c.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewWebSocketExecutor(c.Config, "GET", req.URL().String())
	if err != nil {
		return nil, fmt.Errorf("exec in pod %s/%s of %s: %w", ns, name, c.Name, err)
	}
	var stdout, stderr strings.Builder
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return []byte(stdout.String()), fmt.Errorf("exec %s in pod %s/%s of %s: %w: %s", argv[0], ns, name, c.Name, err, strings.TrimSpace(stderr.String()))
	}
	return []byte(stdout.String()), nil
}
