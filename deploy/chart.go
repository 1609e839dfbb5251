package deploy

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// chartFS holds the Helm chart (ChartDir, its _helpers.tpl included), so RenderChart renders
// exactly the shipped chart from any working directory.
//
//go:embed all:chart/aether
var chartFS embed.FS

// ReleaseName is the Helm release name RenderChart renders the chart as.
const ReleaseName = "aether"

// otherDigest is the agent image digest OtherValues sets.
var otherDigest = "sha256:" + strings.Repeat("ab", 32)

// OtherValues is a Helm values file (YAML) that sets every value of the chart to something other
// than its default. The chart's tests render it to check where each value lands, and the agent's
// and the registrar's tests render it (RenderChart) and parse the rendered configuration with
// their own parsers. It sets cluster east, region eu-west, zone zone-a and a DNS rate limit of 200
// (both through extraConfig), mesh domain mesh.example, trust domain example.org, inbound mode
// permissive, no east-west waypoint, log level debug, registry endpoints https://10.0.0.2:2379
// and https://10.0.0.3:2379 (insecure, TLS files from Secret etcd-client, user
// aether.eu-west.east, password from Secret etcd-password key pw), the development CA from Secret
// mesh-ca, capture backend iptables-legacy, cluster DNS 10.96.0.10 and fd00::a, cluster domain
// corp.example, DNS cache size 0, max TTL 1m, max negative TTL 2s, serve-stale 24h and prefetch 3,
// control cluster hub with config import on, and other images, resources, scheduling and pull
// Secrets.
var OtherValues = `
cluster: east
region: eu-west
meshDomain: mesh.example
trustDomain: example.org
inboundMode: permissive
eastWestWaypoint: false
logLevel: debug
registry:
  endpoints: [https://10.0.0.2:2379, https://10.0.0.3:2379]
  insecure: true
  tls: {enabled: true, secretName: etcd-client, clientCertificate: true}
  user: aether.eu-west.east
  passwordSecret: {name: etcd-password, key: pw}
identity:
  mode: dev-ca
  devCA: {secretName: mesh-ca}
controlCluster: hub
importConfig: true
images:
  agent: {repository: registry.example/aether/agent, tag: ignored, digest: "` + otherDigest + `", pullPolicy: Always}
  envoy: {repository: registry.example/aether/envoy, tag: "1.2.3", pullPolicy: Never}
  registrar: {repository: "registry.example:5000/aether/registrar"}
imagePullSecrets: [{name: regcred}]
agent:
  captureBackend: iptables-legacy
  captureMode: auto
  clusterDNS: [10.96.0.10, "fd00::a"]
  clusterDomain: corp.example
  dnsCache: {size: 0, maxTTL: 1m, maxNegativeTTL: 2s, serveStale: 24h, prefetch: 3}
  resources: {requests: {cpu: 200m, memory: 256Mi}, limits: {cpu: "1", memory: 512Mi}}
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Equal, value: mesh, effect: NoSchedule}]
  priorityClassName: mesh-node
envoy:
  logLevel: warning
  drainTimeSeconds: 20
  resources: {requests: {cpu: 300m, memory: 300Mi}, limits: {memory: 3Gi}}
registrar:
  replicas: 3
  resources: {requests: {cpu: 10m, memory: 32Mi}, limits: {memory: 128Mi}}
  nodeSelector: {node-role.example/control: "true"}
  tolerations: [{key: control, operator: Exists, effect: NoSchedule}]
  affinity:
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {app.kubernetes.io/name: aether-registrar}}
  priorityClassName: mesh-control
extraConfig: {AETHER_DNS_RATE_LIMIT: "200", AETHER_ZONE: zone-a}
namespace: {create: true}
`

// otherSPIREDigest is the SPIRE server image digest OtherSPIREValues sets.
var otherSPIREDigest = "sha256:" + strings.Repeat("cd", 32)

// OtherSPIREValues is a Helm values file (YAML) for identity.mode spire that sets every SPIRE
// value of the chart to something other than its default, as OtherValues does for the rest: SPIRE
// in the namespace identity (not created by the chart), a CA of 48h and SVIDs of 30m, the memory
// key manager, an emptyDir data volume of 256Mi, the Controller Manager's className mesh and
// ignored namespaces kube-system and legacy, the kubelet's certificate verified, workloads
// selected by the namespace label mesh.example/tier in (gold) and the pod label
// mesh.example/identity=spire, other images, resources and scheduling; and cluster east, trust
// domain example.org, log level debug, one registry endpoint, the agents' scheduling and a pull
// Secret. The chart's, the agent's and the e2e tests render it.
var OtherSPIREValues = `
cluster: east
trustDomain: example.org
logLevel: debug
registry:
  endpoints: [https://10.0.0.2:2379]
identity:
  mode: spire
spire:
  namespace: identity
  createNamespace: false
  server:
    caTTL: 48h
    defaultX509SVIDTTL: 30m
    cacheReloadInterval: 250ms
    keyManager: memory
    dataVolume: {type: emptyDir, size: 256Mi, storageClassName: ""}
    resources: {requests: {cpu: 100m, memory: 256Mi}, limits: {memory: 1Gi}}
    nodeSelector: {node-role.example/control: "true"}
    tolerations: [{key: control, operator: Exists, effect: NoSchedule}]
  controllerManager:
    className: mesh
    ignoreNamespaces: [kube-system, legacy]
    resources: {requests: {cpu: 30m, memory: 96Mi}, limits: {memory: 384Mi}}
  agent:
    syncInterval: 300ms
    skipKubeletVerification: false
    resources: {requests: {cpu: 40m, memory: 80Mi}, limits: {memory: 256Mi}}
  workloads:
    namespaceSelector:
      matchLabels: null # Helm merges maps: null drops the default aether.io/mesh=enabled
      matchExpressions: [{key: mesh.example/tier, operator: In, values: [gold]}]
    podSelector:
      matchLabels: {mesh.example/identity: spire}
images:
  spireServer: {repository: registry.example/spire/server, digest: "` + otherSPIREDigest + `"}
  spireAgent: {repository: registry.example/spire/agent, tag: "1.13.3", pullPolicy: Always}
  spireControllerManager: {repository: "registry.example:5000/spire/controller-manager", tag: v0.6.3, pullPolicy: Never}
imagePullSecrets: [{name: regcred}]
agent:
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Equal, value: mesh, effect: NoSchedule}]
  priorityClassName: mesh-node
`

// RenderChart runs `helm template` (helm is the Helm binary's path, such as the cached one of
// internal/testenv) on the chart embedded from ChartDir, as release ReleaseName in namespace,
// and decodes the rendered objects, in Helm's output order (empty documents skipped).
//
// values, unless empty, is a values file's content (YAML, such as OtherValues), passed with -f
// before args; args are added to the command line as they are (--set, --set-string, -f,
// --include-crds, --show-only, ...). Helm runs with cache, configuration and data directories of
// its own and no cluster (KUBECONFIG names a file that does not exist), all in a temporary
// directory removed on return.
//
// It returns an error when the chart or the values cannot be written to the temporary
// directory, when Helm fails or is killed by ctx (the error names the arguments and carries
// Helm's standard error, where the chart's refusals of bad values are), and when its output is
// not YAML (DecodeObjects).
func RenderChart(ctx context.Context, helm, namespace, values string, args ...string) ([]*unstructured.Unstructured, error) {
	dir, err := os.MkdirTemp("", "aether-chart-")
	if err != nil {
		return nil, fmt.Errorf("render chart: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := os.CopyFS(dir, chartFS); err != nil {
		return nil, fmt.Errorf("render chart: write the chart: %w", err)
	}
	cmd := []string{"template", ReleaseName, filepath.Join(dir, ChartDir), "--namespace", namespace}
	if values != "" {
		p := filepath.Join(dir, "values.yaml")
		if err := os.WriteFile(p, []byte(values), 0o600); err != nil {
			return nil, fmt.Errorf("render chart: write the values: %w", err)
		}
		cmd = append(cmd, "-f", p)
	}
	out, err := runHelm(ctx, helm, "", append(cmd, args...)...)
	if err != nil {
		return nil, fmt.Errorf("render chart: %w", err)
	}
	return DecodeObjects("helm template", []byte(out))
}

// runHelm runs the Helm binary helm with args and returns its standard output, or an error
// carrying its standard error. Helm's cache, configuration and data directories are in a
// temporary directory of its own, removed on return; kubeconfig is the cluster it talks to ("":
// none, for lint and template).
func runHelm(ctx context.Context, helm, kubeconfig string, args ...string) (string, error) {
	home, err := os.MkdirTemp("", "aether-helm-")
	if err != nil {
		return "", fmt.Errorf("helm %s: %w", strings.Join(args, " "), err)
	}
	defer os.RemoveAll(home)
	if kubeconfig == "" {
		kubeconfig = filepath.Join(home, "no-cluster")
	}
	cmd := exec.CommandContext(ctx, helm, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// DecodeObject strictly decodes the object of kind and name among objs (such as RenderChart's)
// into out (for example an *appsv1.DaemonSet). It returns an error when objs hold no such
// object, or when the object does not decode into out (an unknown field is an error naming it).
func DecodeObject(objs []*unstructured.Unstructured, kind, name string, out any) error {
	for _, o := range objs {
		if o.GetKind() != kind || o.GetName() != name {
			continue
		}
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			return fmt.Errorf("decode %s %s: %w", kind, name, err)
		}
		if err := yaml.UnmarshalStrict(b, out); err != nil {
			return fmt.Errorf("decode %s %s: %w", kind, name, err)
		}
		return nil
	}
	return fmt.Errorf("decode %s %s: not among the %d objects", kind, name, len(objs))
}
