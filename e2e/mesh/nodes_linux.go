package mesh

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aethermesh/aether/e2e/substrate"
	"github.com/aethermesh/aether/images"
	"github.com/aethermesh/aether/internal/testenv"
)

// Names of what the chart (deploy/chart/aether) installs, as the real-node mesh uses them.
const (
	Namespace       = "aether-system"
	AgentDaemonSet  = "aether-agent"
	RegistrarDeploy = "aether-registrar"
	releaseName     = "aether"
	chartDir        = "deploy/chart/aether"
)

// startNodesMesh is StartMesh with Options.RealNodes: the substrate's real nodes, and aether
// installed as a user installs it. Its images are built here (images.Build: the agent with
// aether-cni, Envoy, the registrar) and pushed to the substrate's registry under the names the
// chart uses; then, per cluster, the Secrets the chart mounts (the development CA, the
// registry's CA and this cluster's client certificate) and `helm install` of deploy/chart/aether
// with the real Helm. The agent DaemonSet's install step is what puts aether-cni in each node's
// conflist. It returns when every agent pod is ready, aether-cni is in every conflist and the
// registrar is available.
func (m *Mesh) startNodesMesh(ctx context.Context, podB string) error {
	opts := m.opts
	tools, err := testenv.FindTools()
	if err != nil {
		return err
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	opts.Logger.Info("building aether's images")
	built, err := images.Build(ctx, images.Options{
		Root: root, CacheDir: filepath.Join(tools.Dir, "images"), Envoy: tools.Envoy, Log: opts.Logger,
	}, meshImages())
	if err != nil {
		return fmt.Errorf("start mesh: %w", err)
	}
	opts.Logger.Info("starting the substrate with real nodes")
	s, err := substrate.Start(ctx, substrate.Options{
		Clusters: substrate.DefaultClusters("10.244.0.0/16", podB),
		BaseDir:  opts.BaseDir, KeepDir: opts.KeepDir, Logger: opts.Logger, RealNodes: true,
		Hooks: substrate.Hooks{Cluster: m.setupRegistryAuth},
	})
	if err != nil {
		return fmt.Errorf("start mesh: %w", err)
	}
	m.Substrate = s
	if err := s.PushImages(ctx, built); err != nil {
		return fmt.Errorf("start mesh: %w", err)
	}
	for _, c := range s.Clusters {
		if err := m.install(ctx, c, tools.Helm, filepath.Join(root, chartDir)); err != nil {
			return fmt.Errorf("start mesh: install aether in %s: %w", c.Name, err)
		}
	}
	digests, err := imageDigests(built)
	if err != nil {
		return fmt.Errorf("start mesh: %w", err)
	}
	for _, c := range s.Clusters {
		if err := waitInstalled(ctx, c); err != nil {
			return fmt.Errorf("start mesh: %w", err)
		}
		if err := runsBuiltImages(ctx, c, Namespace, digests); err != nil {
			return fmt.Errorf("start mesh: %w", err)
		}
	}
	return nil
}

// meshImages are the images the real-node mesh runs: every image but SPIRE's. The chart is
// installed with identity.mode dev-ca until the agent's SPIRE wiring is in (issue #28; install).
func meshImages() []images.Image {
	var out []images.Image
	for _, d := range images.Images() {
		switch d.Ref {
		case images.SPIREServerImage, images.SPIREAgentImage, images.SPIREControllerManagerImage:
		default:
			out = append(out, d)
		}
	}
	return out
}

// imageDigests maps each built image's reference to its digest ("sha256:...").
func imageDigests(built []images.Built) (map[string]string, error) {
	digests := map[string]string{}
	for _, b := range built {
		d, err := b.Image.Digest()
		if err != nil {
			return nil, fmt.Errorf("digest of %s: %w", b.Ref, err)
		}
		digests[b.Ref] = d.String()
	}
	return digests, nil
}

// runsBuiltImages checks that every container of the pods in namespace ns of cluster c (aether's
// or SPIRE's) runs the image built here: the digest its runtime reports
// (status.containerStatuses[].imageID) is the one images.Build made for the reference the pod
// names.
func runsBuiltImages(ctx context.Context, c *substrate.Cluster, ns string, digests map[string]string) error {
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	n := 0
	for _, p := range pods.Items {
		for _, st := range p.Status.ContainerStatuses {
			want, ok := digests[st.Image]
			if !ok {
				// The runtime reports the normalized name: docker.io/library/<ref>.
				want, ok = digests[strings.TrimPrefix(st.Image, "docker.io/library/")]
			}
			if !ok {
				return fmt.Errorf("pod %s/%s container %s runs %s, not an image built here", p.Namespace, p.Name, st.Name, st.Image)
			}
			if !strings.HasSuffix(st.ImageID, "@"+want) {
				return fmt.Errorf("pod %s/%s container %s runs %s (%s), want the digest built here %s", p.Namespace, p.Name, st.Name, st.Image, st.ImageID, want)
			}
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("no container runs in namespace %s of %s", ns, c.Name)
	}
	return nil
}

// install creates cluster c's Secrets and runs helm install (values as a user of this substrate
// sets them: the cluster name, the registry at the cluster's gateway over TLS with a client
// certificate, the mesh's lease TTL, debug logs).
func (m *Mesh) install(ctx context.Context, c *substrate.Cluster, helm, chart string) error {
	return installDevCA(ctx, c, helm, chart, m.CACert, m.CAKey,
		"--set", "extraConfig.AETHER_REGISTRY_LEASE_TTL="+m.opts.LeaseTTL.String(),
		// Gateways may ask for addresses of their cluster's Gateway address pool, which the
		// underlay routes to the cluster's first node (substrate.ClusterPlan.GatewayAddressPool);
		// kube-proxy serves a given one as the edge Service's external IP.
		"--set", "extraConfig.AETHER_GATEWAY_ADDRESS_CIDRS="+c.Plan.GatewayAddressPool.String(),
		// Two edge pods per Gateway, one per node: each is programmed by its own node's agent.
		"--set-string", "extraConfig.AETHER_EDGE_REPLICAS=2",
		"--set", "importConfig=true",
		"--set", "logLevel=debug",
	)
}

// installDevCA installs aether in cluster c as release releaseName of the chart in Namespace
// with the development CA of the files caCert and caKey (identity.mode dev-ca): it creates the
// namespace, the CA Secret and the registry's client Secret, and runs helm install with the
// cluster name and the registry at the cluster's gateway over TLS, and set (more --set
// arguments).
func installDevCA(ctx context.Context, c *substrate.Cluster, helm, chart, caCert, caKey string, set ...string) error {
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	read := func(paths ...string) ([][]byte, error) {
		var out [][]byte
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				return nil, err
			}
			out = append(out, b)
		}
		return out, nil
	}
	ca, err := read(caCert, caKey)
	if err != nil {
		return err
	}
	reg, err := read(c.RegistryCAFile, c.RegistryCertFile, c.RegistryKeyFile)
	if err != nil {
		return err
	}
	for _, sec := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: "aether-ca"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": ca[0], "tls.key": ca[1]}},
		{ObjectMeta: metav1.ObjectMeta{Name: "aether-registry-client"},
			Data: map[string][]byte{"ca.crt": reg[0], "tls.crt": reg[1], "tls.key": reg[2]}},
	} {
		if _, err := c.Client.CoreV1().Secrets(Namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create Secret %s: %w", sec.Name, err)
		}
	}
	args := []string{"install", releaseName, chart, "--namespace", Namespace, "--kubeconfig", c.Kubeconfig,
		// The development CA, explicitly: the chart's default is SPIRE, and the agent's SPIRE
		// wiring is not in yet (issue #28).
		"--set", "identity.mode=dev-ca",
		"--set", "cluster=" + c.Name,
		"--set", "registry.endpoints={" + c.NodeRegistryEndpoint + "}",
		"--set", "registry.tls.enabled=true",
	}
	cmd := exec.CommandContext(ctx, helm, append(args, set...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return nil
}

// waitInstalled waits (up to 4 minutes) until cluster c's agent DaemonSet has a ready pod on
// every node, every node's conflist names aether-cni (the agents' install step) and the
// registrar Deployment is available.
func waitInstalled(ctx context.Context, c *substrate.Cluster) error {
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	var last string
	for {
		last = installState(ctx, c)
		if last == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("aether in %s not ready after 4 minutes: %s (logs: kubectl --kubeconfig %s -n %s logs ds/%s -c agent)", c.Name, last, c.Kubeconfig, Namespace, AgentDaemonSet)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// installState says what is not ready yet of aether in cluster c ("" when all is).
func installState(ctx context.Context, c *substrate.Cluster) string {
	ds, err := c.Client.AppsV1().DaemonSets(Namespace).Get(ctx, AgentDaemonSet, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	if ds.Status.DesiredNumberScheduled != int32(len(c.Nodes)) || ds.Status.NumberReady != ds.Status.DesiredNumberScheduled {
		return fmt.Sprintf("agent DaemonSet: %d of %d ready", ds.Status.NumberReady, len(c.Nodes))
	}
	for _, n := range c.Nodes {
		b, err := os.ReadFile(filepath.Join(n.Root, "etc/cni/net.d", substrate.ConflistFile))
		if err != nil || !bytes.Contains(b, []byte("aether-cni")) {
			return fmt.Sprintf("aether-cni not in %s's conflist", n.Name)
		}
	}
	d, err := c.Client.AppsV1().Deployments(Namespace).Get(ctx, RegistrarDeploy, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	if !available(d) {
		return "registrar Deployment not available"
	}
	return ""
}

func available(d *appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// HelmUpgrade runs `helm upgrade --reuse-values` of aether in cluster with the extra --set
// values (real nodes only), as an operator upgrades or reconfigures aether; it returns once
// Helm has applied the objects (the DaemonSet rolls its pods afterwards).
func (m *Mesh) HelmUpgrade(ctx context.Context, cluster string, set ...string) error {
	if !m.opts.RealNodes {
		return fmt.Errorf("helm upgrade: aether was not installed with Helm (Options.RealNodes is off)")
	}
	c := m.Cluster(cluster)
	if c == nil {
		return fmt.Errorf("helm upgrade: no cluster %q", cluster)
	}
	tools, err := testenv.FindTools()
	if err != nil {
		return err
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	args := []string{"upgrade", releaseName, filepath.Join(root, chartDir), "--namespace", Namespace, "--kubeconfig", c.Kubeconfig, "--reuse-values"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := exec.CommandContext(ctx, tools.Helm, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Workload returns how a pod runs test workload name ("echo", "client", "serverfirst") on this
// mesh: on real nodes the command on the PATH of images.WorkloadsImage and that image; on the
// kubelet stand-in the binary's path on this machine (the image is ignored).
func (m *Mesh) Workload(name string) (command, image string) {
	if m.opts.RealNodes {
		return name, images.WorkloadsImage
	}
	return m.Bins[name], "aether.local/" + name
}
