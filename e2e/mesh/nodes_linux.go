package mesh

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
		Tools: images.ToolPaths(tools.SPIREServer, tools.SPIREAgent, tools.SPIREControllerManager),
	}, m.meshImages())
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
	if m.Identity == IdentitySPIREFederated {
		if err := m.federateReleases(ctx); err != nil {
			return fmt.Errorf("start mesh: %w", err)
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
		if m.spire() {
			if err := runsBuiltImages(ctx, c, spireNamespace, digests); err != nil {
				return fmt.Errorf("start mesh: %w", err)
			}
		}
	}
	return nil
}

// meshImages are the images the real-node mesh runs: every image, SPIRE's but with the
// development CA.
func (m *Mesh) meshImages() []images.Image {
	var out []images.Image
	for _, d := range images.Images() {
		switch d.Ref {
		case images.SPIREServerImage, images.SPIREAgentImage, images.SPIREControllerManagerImage:
			if !m.spire() {
				continue
			}
		}
		out = append(out, d)
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
		if p.DeletionTimestamp != nil {
			continue // a rollout's old pod on its way out
		}
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
// certificate, the mesh's lease TTL, debug logs), with the mesh's identity: the development CA,
// or SPIRE (identity.mode spire, the chart's default) in the mode's spire.clusterset.mode.
func (m *Mesh) install(ctx context.Context, c *substrate.Cluster, helm, chart string) error {
	set := []string{
		"--set", "extraConfig.AETHER_REGISTRY_LEASE_TTL=" + m.opts.LeaseTTL.String(),
		// Gateways may ask for addresses of their cluster's Gateway address pool, which the
		// underlay routes to the cluster's first node (substrate.ClusterPlan.GatewayAddressPool);
		// kube-proxy serves a given one as the edge Service's external IP.
		"--set", "extraConfig.AETHER_GATEWAY_ADDRESS_CIDRS=" + c.Plan.GatewayAddressPool.String(),
		// Two edge pods per Gateway, one per node: each is programmed by its own node's agent.
		"--set-string", "extraConfig.AETHER_EDGE_REPLICAS=2",
		"--set", "importConfig=true",
		"--set", "logLevel=debug",
	}
	if m.Identity == IdentityDevCA {
		return installDevCA(ctx, c, helm, chart, m.CACert, m.CAKey, set...)
	}
	set = append(set,
		"--set", "trustDomain="+m.TrustDomain(c.Name),
		// The substrate has no volume provisioner.
		"--set", "spire.server.dataVolume.type=emptyDir")
	switch m.Identity {
	case IdentitySPIREShared:
		// The upstream authority's Secret exists before SPIRE's pods: SPIRE's namespace is made
		// here, not by the chart.
		if err := c.CreateNamespace(ctx, spireNamespace, map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}); err != nil {
			return err
		}
		ca, err := readFiles(m.UpstreamCACert, m.UpstreamCAKey)
		if err != nil {
			return err
		}
		if err := createSecrets(ctx, c, spireNamespace, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "spire-upstream-authority"},
			Data: map[string][]byte{"upstream-ca.crt": ca[0], "upstream-ca.key": ca[1]}}); err != nil {
			return err
		}
		set = append(set, "--set", "spire.createNamespace=false", "--set", "spire.clusterset.mode=sharedTrustDomain")
	case IdentitySPIREFederated:
		// federateReleases names the other clusters once every SPIRE server runs.
		set = append(set, "--set", "spire.clusterset.mode=federation",
			"--set", "spire.clusterset.bundleEndpoint.service.nodePort="+strconv.Itoa(SPIREBundleNodePort))
	}
	_, err := installChart(ctx, c, helm, chart, "spire", nil, set...)
	return err
}

// spireNamespace is the chart's SPIRE namespace (spire.namespace), and SPIREBundleNodePort the
// node port of each cluster's SPIRE bundle endpoint with IdentitySPIREFederated on real nodes
// (spire.clusterset.bundleEndpoint.service.nodePort): the other cluster's SPIRE server reaches it
// on any node's IP (its pod's traffic leaves its node masqueraded to the node's IP).
const (
	spireNamespace      = "spire"
	SPIREBundleNodePort = 31443
)

// federateReleases federates the clusters' SPIRE servers as an operator does after installing
// the chart with spire.clusterset.mode federation everywhere: it waits until each cluster's
// SPIRE server is ready, reads its bundle (spire-server bundle show -format spiffe, in the
// server's pod), then upgrades each release with spire.clusterset.federatesWith naming every
// other cluster's trust domain, bundle endpoint (its first node's IP, SPIREBundleNodePort) and
// that bundle, and waits until each SPIRE server holds the others' bundles (fetched from their
// endpoints by the Controller Manager's ClusterFederatedTrustDomains).
func (m *Mesh) federateReleases(ctx context.Context) error {
	bundles := map[string]string{}
	for _, c := range m.Clusters {
		b, err := spireServerExec(ctx, c, 5*time.Minute, "bundle", "show", "-format", "spiffe")
		if err != nil {
			return fmt.Errorf("bundle of %s: %w", c.Name, err)
		}
		bundles[c.Name] = b
	}
	for _, c := range m.Clusters {
		var fw []map[string]string
		for _, o := range m.Clusters {
			if o.Name == c.Name {
				continue
			}
			fw = append(fw, map[string]string{
				"trustDomain":       m.TrustDomain(o.Name),
				"bundleEndpointURL": "https://" + net.JoinHostPort(o.Plan.Nodes[0].IP.String(), strconv.Itoa(SPIREBundleNodePort)),
				"trustDomainBundle": bundles[o.Name],
			})
		}
		b, err := json.Marshal(fw)
		if err != nil {
			return err
		}
		if err := m.helmUpgrade(ctx, c, "--set-json", "spire.clusterset.federatesWith="+string(b)); err != nil {
			return err
		}
	}
	for _, c := range m.Clusters {
		for _, o := range m.Clusters {
			if o.Name == c.Name {
				continue
			}
			if _, err := spireServerExec(ctx, c, 3*time.Minute, "bundle", "list", "-id", "spiffe://"+m.TrustDomain(o.Name)); err != nil {
				return fmt.Errorf("the SPIRE server of %s does not hold the bundle of %s: %w", c.Name, o.Name, err)
			}
		}
	}
	return nil
}

// spireServerExec runs spire-server args (on its API socket) in cluster c's SPIRE server pod,
// trying again for up to within while the pod is not there or the command fails, and returns its
// output.
func spireServerExec(ctx context.Context, c *substrate.Cluster, within time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	argv := append(append([]string{"spire-server"}, args...), "-socketPath", "/run/spire/server-api/api.sock")
	for {
		out, err := c.ExecInContainer(ctx, spireNamespace, "spire-server-0", "spire-server", argv...)
		if err == nil && len(bytes.TrimSpace(out)) > 0 {
			return string(out), nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s in %s/spire-server-0 of %s: %v (%w)", strings.Join(argv, " "), spireNamespace, c.Name, err, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// readFiles returns the contents of paths.
func readFiles(paths ...string) ([][]byte, error) {
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

// createSecrets creates secrets in namespace ns of cluster c (one that exists already is left).
func createSecrets(ctx context.Context, c *substrate.Cluster, ns string, secrets ...*corev1.Secret) error {
	for _, sec := range secrets {
		if _, err := c.Client.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create Secret %s/%s: %w", ns, sec.Name, err)
		}
	}
	return nil
}

// installDevCA installs aether in cluster c as release releaseName of the chart in Namespace
// with the development CA of the files caCert and caKey (identity.mode dev-ca): the CA Secret,
// then installChart with set (more helm arguments).
func installDevCA(ctx context.Context, c *substrate.Cluster, helm, chart, caCert, caKey string, set ...string) error {
	ca, err := readFiles(caCert, caKey)
	if err != nil {
		return err
	}
	_, err = installChart(ctx, c, helm, chart, "dev-ca", []*corev1.Secret{{ObjectMeta: metav1.ObjectMeta{Name: "aether-ca"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": ca[0], "tls.key": ca[1]}}}, set...)
	return err
}

// installChart installs aether in cluster c as release releaseName of the chart in Namespace with
// identity.mode mode: it creates the namespace, secrets and the registry's client Secret, and
// runs helm install with the cluster name and the registry at the cluster's gateway over TLS,
// and set (more helm arguments). It returns Helm's output (the release's NOTES).
func installChart(ctx context.Context, c *substrate.Cluster, helm, chart, mode string, secrets []*corev1.Secret, set ...string) (string, error) {
	if err := c.CreateNamespace(ctx, Namespace, nil); err != nil {
		return "", err
	}
	reg, err := readFiles(c.RegistryCAFile, c.RegistryCertFile, c.RegistryKeyFile)
	if err != nil {
		return "", err
	}
	if err := createSecrets(ctx, c, Namespace, append(secrets, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "aether-registry-client"},
		Data: map[string][]byte{"ca.crt": reg[0], "tls.crt": reg[1], "tls.key": reg[2]}})...); err != nil {
		return "", err
	}
	args := []string{"install", releaseName, chart, "--namespace", Namespace, "--kubeconfig", c.Kubeconfig,
		"--set", "identity.mode=" + mode,
		"--set", "cluster=" + c.Name,
		"--set", "registry.endpoints={" + c.NodeRegistryEndpoint + "}",
		"--set", "registry.tls.enabled=true",
	}
	cmd := exec.CommandContext(ctx, helm, append(args, set...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("helm %s: %w\n%s", strings.Join(append(args, set...), " "), err, out.String())
	}
	return out.String(), nil
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
	if ds.Status.ObservedGeneration < ds.Generation || ds.Status.UpdatedNumberScheduled != ds.Status.DesiredNumberScheduled {
		return fmt.Sprintf("agent DaemonSet: rolling out (%d of %d pods updated)", ds.Status.UpdatedNumberScheduled, len(c.Nodes))
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
	// Rolled out (a helm upgrade that changed aether-config rolls it): every replica updated, no
	// old one left.
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	if d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas != want || d.Status.Replicas != want {
		return fmt.Sprintf("registrar Deployment: rolling out (%d of %d replicas updated, %d in all)", d.Status.UpdatedReplicas, want, d.Status.Replicas)
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
	var args []string
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return m.helmUpgrade(ctx, c, args...)
}

// helmUpgrade runs `helm upgrade --reuse-values` of aether in cluster c with args.
func (m *Mesh) helmUpgrade(ctx context.Context, c *substrate.Cluster, args ...string) error {
	tools, err := testenv.FindTools()
	if err != nil {
		return err
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	args = append([]string{"upgrade", releaseName, filepath.Join(root, chartDir), "--namespace", Namespace, "--kubeconfig", c.Kubeconfig, "--reuse-values"}, args...)
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
