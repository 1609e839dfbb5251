package deploy

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/aethermesh/aether/internal/testenv"
)

// helm runs the cached Helm (testenv.ToolHelm) in deploy/ with args and returns its standard
// output, or an error carrying its standard error (runHelm). Helm's cache, configuration and
// data directories are its own; kubeconfig is the cluster it talks to ("": none, for lint and
// template).
func helm(t *testing.T, kubeconfig string, args ...string) (string, error) {
	t.Helper()
	return runHelm(context.Background(), testenv.RequireTools(t, testenv.ToolHelm).Helm, kubeconfig, args...)
}

// render renders the chart in namespace with values (a values file's content, "" for none) and
// args (--set, ...) with RenderChart and the cached Helm; it fails the test when Helm refuses.
func render(t *testing.T, namespace, values string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := RenderChart(context.Background(), testenv.RequireTools(t, testenv.ToolHelm).Helm, namespace, values, args...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// valuesFile writes values (YAML) to a file for helm's -f and returns its path.
func valuesFile(t *testing.T, values string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// object decodes the object of kind and name among objs into out (DecodeObject), failing the
// test when there is none.
func object(t *testing.T, objs []*unstructured.Unstructured, kind, name string, out any) {
	t.Helper()
	if err := DecodeObject(objs, kind, name, out); err != nil {
		t.Fatal(err)
	}
}

// hasObject reports whether objs hold an object of kind and name.
func hasObject(objs []*unstructured.Unstructured, kind, name string) bool {
	return slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind && o.GetName() == name })
}

// appVersion is the chart's appVersion, the images' default tag.
func appVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ChartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil || c.AppVersion == "" {
		t.Fatalf("Chart.yaml: appVersion %q (%v)", c.AppVersion, err)
	}
	return c.AppVersion
}

// rl is a resource list of name, quantity pairs ("cpu", "100m", "memory", "128Mi").
func rl(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

// TestChartLint runs helm lint --strict on the chart with its defaults, with OtherValues, with
// OtherSPIREValues and with SPIRE alone.
func TestChartLint(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
	}{
		{"defaults", nil},
		{"other values", []string{"-f", valuesFile(t, OtherValues)}},
		{"other SPIRE values", []string{"-f", valuesFile(t, OtherSPIREValues)}},
		{"SPIRE only", []string{"--set", "mesh.enabled=false"}},
	} {
		out, err := helm(t, "", append([]string{"lint", "--strict", ChartDir}, c.args...)...)
		if err != nil || !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
			t.Errorf("%s: helm lint: %v\n%s", c.name, err, out)
		}
	}
}

// TestChartDefaultsAreTheManifests renders the chart with its defaults as
// hack/update-manifests.sh does and checks that the objects are exactly those of the manifests
// under deploy/ (which verify-manifests.sh compares as text): nothing missing, nothing extra.
func TestChartDefaultsAreTheManifests(t *testing.T) {
	rendered := render(t, "aether-system", "", "--include-crds", "--set", "namespace.create=true")
	uninstall := render(t, "aether-system", "", "--set", "cniUninstall=true", "--show-only", "templates/uninstall/cni-uninstall.yaml")
	key := func(o *unstructured.Unstructured) string {
		return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
	}
	want := map[string]*unstructured.Unstructured{}
	for _, o := range append(rendered, uninstall...) {
		want[key(o)] = o
	}
	files, err := Files()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range files {
		objs, err := Objects(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.GetKind() == "Kustomization" {
				continue
			}
			k := key(o)
			seen[k] = true
			if w, ok := want[k]; !ok {
				t.Errorf("%s: %s is not rendered by the chart", f, k)
			} else if !reflect.DeepEqual(o.Object, w.Object) {
				t.Errorf("%s: %s differs from the chart's (run hack/update-manifests.sh)", f, k)
			}
		}
	}
	for k := range want {
		if !seen[k] {
			t.Errorf("the chart renders %s, which no file under deploy/ holds (run hack/update-manifests.sh)", k)
		}
	}
	if len(seen) < 20 {
		t.Errorf("compared %d objects; the manifests hold more", len(seen))
	}
}

// TestChartValues renders the chart with OtherValues in namespace mesh-system and checks that
// each value lands where it should: the ConfigMap holds the values' configuration (which the
// agent's and the registrar's own parsers read back through their containers' args and
// environment in their packages' TestChartValuesAgent and TestChartValuesRegistrar); the images,
// pull policies, resources, scheduling and Secrets are the values'; every object, binding subject
// and admission policy names the release namespace; and the pods' config checksum follows the
// ConfigMap.
func TestChartValues(t *testing.T) {
	const ns = "mesh-system"
	objs := render(t, ns, OtherValues)
	defaults := render(t, "aether-system", "")

	var cm corev1.ConfigMap
	object(t, objs, "ConfigMap", "aether-config", &cm)
	wantData := map[string]string{
		"AETHER_CLUSTER": "east", "AETHER_REGION": "eu-west", "AETHER_MESH_DOMAIN": "mesh.example",
		"AETHER_TRUST_DOMAIN": "example.org", "AETHER_INBOUND_MODE": "permissive", "AETHER_EAST_WEST_WAYPOINT": "false",
		"AETHER_LOG_LEVEL": "debug", "AETHER_REGISTRY_ENDPOINTS": "https://10.0.0.2:2379,https://10.0.0.3:2379",
		"AETHER_REGISTRY_INSECURE": "true", "AETHER_REGISTRY_CA": "/etc/aether/registry/ca.crt",
		"AETHER_REGISTRY_CERT": "/etc/aether/registry/tls.crt", "AETHER_REGISTRY_KEY": "/etc/aether/registry/tls.key",
		"AETHER_REGISTRY_USER": "aether.eu-west.east", "AETHER_CAPTURE_BACKEND": "iptables-legacy", "AETHER_CAPTURE_MODE": "auto",
		"AETHER_CLUSTER_DNS": "10.96.0.10,fd00::a", "AETHER_CLUSTER_DOMAIN": "corp.example",
		"AETHER_DNS_CACHE_SIZE": "0", "AETHER_DNS_CACHE_MAX_TTL": "1m", "AETHER_DNS_CACHE_MAX_NEGATIVE_TTL": "2s",
		"AETHER_DNS_CACHE_SERVE_STALE": "24h", "AETHER_DNS_CACHE_PREFETCH": "3",
		"AETHER_DNS_RATE_LIMIT": "200", "AETHER_ZONE": "zone-a",
		"AETHER_CONTROL_CLUSTER": "hub", "AETHER_IMPORT_CONFIG": "true",
	}
	if !maps.Equal(cm.Data, wantData) {
		t.Errorf("aether-config data:\n got %v\nwant %v", cm.Data, wantData)
	}

	var ds appsv1.DaemonSet
	object(t, objs, "DaemonSet", "aether-agent", &ds)
	spec := ds.Spec.Template.Spec
	ag, err := Container(spec, "agent")
	if err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	object(t, objs, "Deployment", "aether-registrar", &dep)
	rspec := dep.Spec.Template.Spec
	rc, err := Container(rspec, "registrar")
	if err != nil {
		t.Fatal(err)
	}

	// Images, pull policies, resources.
	en, err := Container(spec, "envoy")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		c         corev1.Container
		image     string
		policy    corev1.PullPolicy
		resources corev1.ResourceRequirements
	}{
		{ag, "registry.example/aether/agent@" + otherDigest, corev1.PullAlways,
			corev1.ResourceRequirements{Requests: rl("cpu", "200m", "memory", "256Mi"), Limits: rl("cpu", "1", "memory", "512Mi")}},
		{en, "registry.example/aether/envoy:1.2.3", corev1.PullNever,
			corev1.ResourceRequirements{Requests: rl("cpu", "300m", "memory", "300Mi"), Limits: rl("memory", "3Gi")}},
		{rc, "registry.example:5000/aether/registrar:" + appVersion(t), corev1.PullIfNotPresent,
			corev1.ResourceRequirements{Requests: rl("cpu", "10m", "memory", "32Mi"), Limits: rl("memory", "128Mi")}},
	} {
		if c.c.Image != c.image || c.c.ImagePullPolicy != c.policy {
			t.Errorf("container %s: image %s (%s), want %s (%s)", c.c.Name, c.c.Image, c.c.ImagePullPolicy, c.image, c.policy)
		}
		if !equality.Semantic.DeepEqual(c.c.Resources, c.resources) {
			t.Errorf("container %s: resources %v, want %v", c.c.Name, c.c.Resources, c.resources)
		}
	}
	if a := strings.Join(en.Args, " "); !strings.Contains(a, "--drain-time-s 20") || !strings.Contains(a, "--log-level warning") {
		t.Errorf("envoy args %q, want --drain-time-s 20 and --log-level warning", a)
	}

	// Scheduling and pull Secrets.
	pullSecrets := []corev1.LocalObjectReference{{Name: "regcred"}}
	if !reflect.DeepEqual(spec.NodeSelector, map[string]string{"kubernetes.io/os": "linux"}) || spec.PriorityClassName != "mesh-node" ||
		!reflect.DeepEqual(spec.Tolerations, []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "mesh", Effect: corev1.TaintEffectNoSchedule}}) ||
		!reflect.DeepEqual(spec.ImagePullSecrets, pullSecrets) {
		t.Errorf("agent pods: nodeSelector %v, priorityClassName %q, tolerations %v, imagePullSecrets %v; want the values'",
			spec.NodeSelector, spec.PriorityClassName, spec.Tolerations, spec.ImagePullSecrets)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 || rspec.PriorityClassName != "mesh-control" ||
		!reflect.DeepEqual(rspec.NodeSelector, map[string]string{"node-role.example/control": "true"}) ||
		!reflect.DeepEqual(rspec.Tolerations, []corev1.Toleration{{Key: "control", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}) ||
		rspec.Affinity == nil || rspec.Affinity.PodAntiAffinity == nil || len(rspec.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		!reflect.DeepEqual(rspec.ImagePullSecrets, pullSecrets) {
		t.Errorf("registrar: replicas %v, priorityClassName %q, nodeSelector %v, tolerations %v, affinity %+v, imagePullSecrets %v; want the values'",
			dep.Spec.Replicas, rspec.PriorityClassName, rspec.NodeSelector, rspec.Tolerations, rspec.Affinity, rspec.ImagePullSecrets)
	}

	// The release namespace everywhere.
	if !hasObject(objs, "Namespace", ns) {
		t.Errorf("namespace.create: no Namespace %s", ns)
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "CustomResourceDefinition":
			if o.GetNamespace() != "" {
				t.Errorf("%s %s: cluster-scoped, has namespace %q", o.GetKind(), o.GetName(), o.GetNamespace())
			}
		default:
			if o.GetNamespace() != ns {
				t.Errorf("%s %s: namespace %q, want the release's %s", o.GetKind(), o.GetName(), o.GetNamespace(), ns)
			}
		}
	}
	for _, name := range []string{"aether-agent", "aether-registrar"} {
		var crb rbacv1.ClusterRoleBinding
		object(t, objs, "ClusterRoleBinding", name, &crb)
		if len(crb.Subjects) != 1 || crb.Subjects[0].Namespace != ns {
			t.Errorf("ClusterRoleBinding %s: subjects %+v, want the ServiceAccount in %s", name, crb.Subjects, ns)
		}
	}
	for policy, sa := range map[string]string{"aether-agent-node-pods": "aether-agent", "aether-registrar-managed-objects": "aether-registrar"} {
		var p struct {
			Spec struct {
				MatchConditions []struct{ Expression string } `json:"matchConditions"`
			} `json:"spec"`
		}
		for _, o := range objs {
			if o.GetKind() == "ValidatingAdmissionPolicy" && o.GetName() == policy {
				b, _ := yaml.Marshal(o.Object)
				if err := yaml.Unmarshal(b, &p); err != nil {
					t.Fatal(err)
				}
			}
		}
		want := "'system:serviceaccount:" + ns + ":" + sa + "'"
		if len(p.Spec.MatchConditions) != 1 || !strings.Contains(p.Spec.MatchConditions[0].Expression, want) {
			t.Errorf("ValidatingAdmissionPolicy %s: match conditions %+v, want the user %s", policy, p.Spec.MatchConditions, want)
		}
	}

	// helm upgrade rolls the pods when the configuration changes.
	var dds appsv1.DaemonSet
	object(t, defaults, "DaemonSet", "aether-agent", &dds)
	sum := ds.Spec.Template.Annotations["checksum/config"]
	if sum == "" || sum == dds.Spec.Template.Annotations["checksum/config"] || dep.Spec.Template.Annotations["checksum/config"] != sum {
		t.Errorf("checksum/config: agent %q, registrar %q, defaults' %q; want one value, different from the defaults'",
			sum, dep.Spec.Template.Annotations["checksum/config"], dds.Spec.Template.Annotations["checksum/config"])
	}
	if hasObject(defaults, "Namespace", "aether-system") || hasObject(objs, "CustomResourceDefinition", "httproutes.gateway.networking.k8s.io") {
		t.Error("the defaults render a Namespace, or helm template without --include-crds renders CRDs")
	}
	if hasObject(objs, "DaemonSet", "aether-cni-uninstall") {
		t.Error("the CNI uninstall DaemonSet is rendered without cniUninstall")
	}
}

// TestChartCNIUninstall renders the chart with cniUninstall: the agent DaemonSet makes way for the
// uninstall DaemonSet, which runs the agent image of the values on the agent's nodes.
func TestChartCNIUninstall(t *testing.T) {
	objs := render(t, "mesh-system", OtherValues, "--set", "cniUninstall=true")
	if hasObject(objs, "DaemonSet", "aether-agent") {
		t.Error("cniUninstall: the agent DaemonSet is still rendered")
	}
	var ds appsv1.DaemonSet
	object(t, objs, "DaemonSet", "aether-cni-uninstall", &ds)
	spec := ds.Spec.Template.Spec
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if c.Image != "registry.example/aether/agent@"+otherDigest || c.ImagePullPolicy != corev1.PullAlways {
			t.Errorf("uninstall container %s: image %s (%s), want the agent's", c.Name, c.Image, c.ImagePullPolicy)
		}
	}
	if !reflect.DeepEqual(spec.NodeSelector, map[string]string{"kubernetes.io/os": "linux"}) || len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "dedicated" ||
		len(spec.ImagePullSecrets) != 1 {
		t.Errorf("uninstall pods: nodeSelector %v, tolerations %v, imagePullSecrets %v; want the agent's", spec.NodeSelector, spec.Tolerations, spec.ImagePullSecrets)
	}
	if !hasObject(objs, "Deployment", "aether-registrar") || !hasObject(objs, "ConfigMap", "aether-config") {
		t.Error("cniUninstall removes more than the agent DaemonSet")
	}
}

// TestChartRefusesBadValues checks that helm template refuses each bad value with an error that
// names the value (values.schema.json, or the chart's own checks for what a schema cannot say).
func TestChartRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"cluster not a label", []string{"--set", "cluster=East_1"}, []string{"/cluster", "East_1"}},
		{"empty region", []string{"--set", "region="}, []string{"/region"}},
		{"mesh domain", []string{"--set", "meshDomain=Mesh Domain"}, []string{"/meshDomain"}},
		{"inbound mode", []string{"--set", "inboundMode=lenient"}, []string{"/inboundMode", "lenient"}},
		{"waypoint not a boolean", []string{"--set-string", "eastWestWaypoint=maybe"}, []string{"/eastWestWaypoint"}},
		{"log level", []string{"--set", "logLevel=verbose"}, []string{"/logLevel", "verbose"}},
		{"endpoint without scheme", []string{"--set", "registry.endpoints={etcd-0:2379}"}, []string{"/registry/endpoints/0", "etcd-0:2379"}},
		{"endpoints a string", []string{"--set", "registry.endpoints=https://etcd-0:2379"}, []string{"/registry/endpoints"}},
		{"TLS Secret name", []string{"--set", "registry.tls.secretName=Etcd_Client"}, []string{"/registry/tls/secretName"}},
		{"password without user", []string{"--set", "registry.passwordSecret.name=etcd-password"}, []string{"registry.passwordSecret.name", "registry.user"}},
		{"identity mode", []string{"--set", "identity.mode=vault"}, []string{"/identity/mode", "spire", "dev-ca"}},
		{"SPIRE only in dev-ca mode", []string{"--set", "mesh.enabled=false", "--set", "identity.mode=dev-ca"}, []string{"mesh.enabled false", "identity.mode \"dev-ca\""}},
		{"SPIRE in the release namespace", []string{"--set", "spire.namespace=aether-system"}, []string{"spire.namespace \"aether-system\"", "release namespace"}},
		{"SPIRE namespace not a label", []string{"--set", "spire.namespace=Spire"}, []string{"/spire/namespace", "Spire"}},
		{"release namespace ignored", []string{"--set", "spire.controllerManager.ignoreNamespaces={kube-system,aether-system}"}, []string{"spire.controllerManager.ignoreNamespaces", "aether-system"}},
		{"ignored namespace not a name", []string{"--set", "spire.controllerManager.ignoreNamespaces={kube-.*}"}, []string{"/spire/controllerManager/ignoreNamespaces/0"}},
		{"CA TTL", []string{"--set", "spire.server.caTTL=1day"}, []string{"/spire/server/caTTL", "1day"}},
		{"SVID TTL", []string{"--set", "spire.server.defaultX509SVIDTTL=30"}, []string{"/spire/server/defaultX509SVIDTTL"}},
		{"key manager", []string{"--set", "spire.server.keyManager=hsm"}, []string{"/spire/server/keyManager", "hsm"}},
		{"data volume type", []string{"--set", "spire.server.dataVolume.type=hostPath"}, []string{"/spire/server/dataVolume/type", "hostPath"}},
		{"data volume size", []string{"--set", "spire.server.dataVolume.size=big"}, []string{"/spire/server/dataVolume/size"}},
		{"class name", []string{"--set", "spire.controllerManager.className=Mesh Class"}, []string{"/spire/controllerManager/className"}},
		{"kubelet verification not a boolean", []string{"--set-string", "spire.agent.skipKubeletVerification=yes"}, []string{"/spire/agent/skipKubeletVerification"}},
		{"misspelt workload selector", []string{"--set", "spire.workloads.namespaceSelector.matchLabel.a=b"}, []string{"/spire/workloads/namespaceSelector", "matchLabel"}},
		{"selector operator", []string{"--set", "spire.workloads.podSelector.matchExpressions[0].key=a", "--set", "spire.workloads.podSelector.matchExpressions[0].operator=Like"}, []string{"/spire/workloads/podSelector/matchExpressions/0/operator", "Like"}},
		{"SPIRE image digest", []string{"--set", "images.spireAgent.digest=sha256:abc"}, []string{"/images/spireAgent/digest"}},
		{"extraConfig of the identity source", []string{"--set", "extraConfig.AETHER_IDENTITY_SOURCE=dev-ca"}, []string{"extraConfig.AETHER_IDENTITY_SOURCE", "the value identity.mode"}},
		{"extraConfig of the admin socket", []string{"--set", "extraConfig.AETHER_SPIRE_ADMIN_SOCKET=/tmp/a.sock"}, []string{"extraConfig.AETHER_SPIRE_ADMIN_SOCKET", "identity.mode"}},
		{"control cluster not a label", []string{"--set", "controlCluster=Hub_1"}, []string{"/controlCluster", "Hub_1"}},
		{"control cluster too long", []string{"--set", "controlCluster=" + strings.Repeat("a", 64)}, []string{"/controlCluster"}},
		{"import config not a boolean", []string{"--set-string", "importConfig=yes"}, []string{"/importConfig"}},
		{"extraConfig of the control cluster", []string{"--set", "extraConfig.AETHER_CONTROL_CLUSTER=hub"}, []string{"extraConfig.AETHER_CONTROL_CLUSTER", "the value controlCluster"}},
		{"extraConfig of config import", []string{"--set-string", "extraConfig.AETHER_IMPORT_CONFIG=true"}, []string{"extraConfig.AETHER_IMPORT_CONFIG", "the value importConfig"}},
		{"image digest", []string{"--set", "images.agent.digest=sha256:abc"}, []string{"/images/agent/digest"}},
		{"pull policy", []string{"--set", "images.envoy.pullPolicy=Sometimes"}, []string{"/images/envoy/pullPolicy", "Sometimes"}},
		{"empty repository", []string{"--set", "images.registrar.repository="}, []string{"/images/registrar/repository"}},
		{"resource quantity", []string{"--set", "agent.resources.limits.memory=lots"}, []string{"/agent/resources/limits/memory"}},
		{"unknown resources field", []string{"--set", "envoy.resources.limit.memory=1Gi"}, []string{"/envoy/resources", "limit"}},
		{"capture backend", []string{"--set", "agent.captureBackend=bpf"}, []string{"/agent/captureBackend", "bpf"}},
		{"capture mode", []string{"--set", "agent.captureMode=bpf"}, []string{"/agent/captureMode", "bpf"}},
		{"cluster DNS", []string{"--set", "agent.clusterDNS={kube-dns}"}, []string{"/agent/clusterDNS/0"}},
		{"DNS cache duration", []string{"--set", "agent.dnsCache.maxTTL=30"}, []string{"/agent/dnsCache/maxTTL"}},
		{"DNS cache size", []string{"--set", "agent.dnsCache.size=-1"}, []string{"/agent/dnsCache/size"}},
		{"Envoy log level", []string{"--set", "envoy.logLevel=loud"}, []string{"/envoy/logLevel", "loud"}},
		{"replicas", []string{"--set", "registrar.replicas=0"}, []string{"/registrar/replicas"}},
		{"misspelt value", []string{"--set", "clustr=east"}, []string{"clustr"}},
		{"misspelt nested value", []string{"--set", "registry.endpoint={https://etcd-0:2379}"}, []string{"/registry", "endpoint"}},
		{"extraConfig key", []string{"--set", "extraConfig.NODE_NAME=x"}, []string{"/extraConfig", "NODE_NAME"}},
		{"extraConfig of a value", []string{"--set", "extraConfig.AETHER_CLUSTER=east"}, []string{"extraConfig.AETHER_CLUSTER", "the value cluster"}},
	} {
		t.Run(c.name, func(t *testing.T) { wantRefused(t, c.args, c.want...) })
	}
}

// wantRefused checks that helm template of the chart with args fails with an error naming each
// of want.
func wantRefused(t *testing.T, args []string, want ...string) {
	t.Helper()
	out, err := helm(t, "", append([]string{"template", "aether", ChartDir, "--namespace", "aether-system"}, args...)...)
	if err == nil {
		t.Fatalf("helm template %v succeeded, want a refusal naming %v:\n%s", args, want, testenv.Tail(out, 500))
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("helm template %v: %v\nwant it to name %q", args, err, w)
		}
	}
}

// TestChartServerSideDryRun renders the chart with its defaults, with OtherValues (namespace
// mesh-system), for removal (cniUninstall) and in SPIRE's modes (both spire.clusterset modes
// among them), creates the rendered CRDs and Namespaces on a real
// kube-apiserver, and applies every other object with a strict server-side dry run.
func TestChartServerSideDryRun(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	ap := newApplier(t, api)
	kinds := map[string]int{}
	var crds map[string]*unstructured.Unstructured
	for _, c := range []struct {
		name, namespace, values string
		args                    []string
	}{
		{"defaults", "aether-system", "", nil},
		{"other values", "mesh-system", OtherValues, nil},
		{"cniUninstall", "aether-system", "", []string{"--set", "cniUninstall=true"}},
		// SPIRE's namespace identity is not the chart's (spire.createNamespace false): made below.
		{"other SPIRE values", "mesh-system", OtherSPIREValues, nil},
		{"SPIRE on a volume claim", "spire-pvc", "", []string{"--set", "spire.namespace=spire-pvc-ns", "--set", "spire.server.dataVolume.storageClassName=fast",
			"--set", "spire.server.dataVolume.size=5Gi"}},
		{"SPIRE only", "spire-only", "", []string{"--set", "mesh.enabled=false", "--set", "spire.namespace=spire-only-ns"}},
		{"SPIRE federation", "spire-fed", "", append([]string{"--set", "spire.namespace=spire-fed-ns", "--set", "trustDomain=alpha.example.org",
			"--set", "spire.clusterset.mode=federation", "--set", "spire.controllerManager.className=fed"},
			federatesWith(t, map[string]string{"trustDomain": "beta.example.org", "bundleEndpointURL": "https://192.0.2.10:31443", "trustDomainBundle": betaBundle})...)},
		{"SPIRE shared trust domain", "spire-shared", "", []string{"--set", "spire.namespace=spire-shared-ns", "--set", "spire.controllerManager.className=shared",
			"--set", "spire.clusterset.mode=sharedTrustDomain", "--set", "spire.clusterset.upstreamAuthority.intermediate=true"}},
	} {
		if c.values == OtherSPIREValues {
			if err := ap.apply(&unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace",
				"metadata": map[string]any{"name": "identity"}}}, false); err != nil {
				t.Fatal(err)
			}
		}
		objs := render(t, c.namespace, c.values, append([]string{"--include-crds", "--set", "namespace.create=true"}, c.args...)...)
		rendered := map[string]*unstructured.Unstructured{}
		for _, o := range objs {
			if o.GetKind() == "CustomResourceDefinition" {
				rendered[o.GetName()] = o
			}
		}
		if len(rendered) != 17 {
			t.Errorf("%s: %d CRDs rendered, want the 17 of MCS, Gateway API, aether (AuthorizationPolicy, PeerAuthentication) and SPIRE's Controller Manager", c.name, len(rendered))
		}
		if crds == nil {
			// Created for real from the first render (the next ones render the same files).
			crds = rendered
			dir := t.TempDir()
			for n, o := range crds {
				b, err := yaml.Marshal(o.Object)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, n+".yaml"), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			testenv.InstallCRDs(t, api.Config, dir)
			ap.mapper.Reset()
		} else if !reflect.DeepEqual(rendered, crds) {
			t.Errorf("%s: the CRDs differ from the defaults' (values must not change crds/)", c.name)
		}
		for _, o := range objs {
			switch o.GetKind() {
			case "CustomResourceDefinition":
			case "Namespace": // namespaced objects need their namespace, even in a dry run
				if err := ap.apply(o, false); err != nil {
					t.Fatalf("%s: create namespace %s: %v", c.name, o.GetName(), err)
				}
			default:
				if err := ap.apply(o, true); err != nil {
					t.Errorf("%s: dry-run apply %s %s: %v", c.name, o.GetKind(), o.GetName(), err)
					continue
				}
				kinds[o.GetKind()]++
			}
		}
	}
	t.Logf("dry-run applied: %v", kinds)
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "DaemonSet", "Deployment", "ConfigMap",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "StatefulSet", "Service", "ClusterSPIFFEID"} {
		if kinds[k] == 0 {
			t.Errorf("no %s among the rendered objects", k)
		}
	}
	// The aether agent's: defaults, other values, other SPIRE values, the volume claim, federation,
	// shared trust domain; the SPIRE agent's: defaults, cniUninstall, other SPIRE values, the
	// volume claim, SPIRE only, federation, shared trust domain; the uninstall one: cniUninstall.
	if kinds["DaemonSet"] != 14 {
		t.Errorf("%d DaemonSets applied, want 14 (6 of the aether agent, 7 of the SPIRE agent, the uninstall one)", kinds["DaemonSet"])
	}
	if kinds["StatefulSet"] != 7 || kinds["ClusterSPIFFEID"] != 21 || kinds["ClusterFederatedTrustDomain"] != 1 {
		t.Errorf("%d StatefulSets, %d ClusterSPIFFEIDs and %d ClusterFederatedTrustDomains applied, want 7, 21 and 1 (a SPIRE server and three ClusterSPIFFEIDs in each of the 7 SPIRE renders, the federation's one trust domain)",
			kinds["StatefulSet"], kinds["ClusterSPIFFEID"], kinds["ClusterFederatedTrustDomain"])
	}
}

// TestChartHelmInstall installs, upgrades and removes the chart with the real Helm on a real
// kube-apiserver, as docs/deploy.md says. A server dry run into a namespace that enforces Pod
// Security baseline, without cluster name and registry, warns of both in its NOTES, and of what
// SPIRE lacks there: the ClusterSPIFFEID CRD (a dry run creates none, so the ClusterSPIFFEIDs are
// left out instead of failing) and a default StorageClass; a dry run in dev-ca mode names the
// missing CA Secret. Then: the namespace made first with its Pod Security label, a default
// StorageClass; an existing Gateway API CRD (another implementation's) is kept, the missing CRDs
// created; SPIRE's namespace (Pod Security privileged), server, agents and ClusterSPIFFEIDs
// installed; an upgrade that changes a value updates the ConfigMaps and the pods' checksums
// (aether's and SPIRE's) and keeps the bundle the SPIRE server wrote into spire-bundle;
// cniUninstall is refused while the agent DaemonSet exists and replaces it once it is gone; helm
// uninstall removes the release's objects (SPIRE's namespace too) and keeps the CRDs.
func TestChartHelmInstall(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	cs := kubernetes.NewForConfigOrDie(api.Config)
	ext := apiextclient.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns = "aether-system"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Another Gateway API implementation installed GatewayClasses already.
	testenv.InstallCRDs(t, api.Config, testenv.CRDSubset(t, "gateway.networking.k8s.io_gatewayclasses.yaml"))
	kc := api.Kubeconfig

	// NOTES warn of what would keep aether from starting: a namespace whose Pod Security level
	// refuses the agent, and no cluster name or registry (a server dry run reads the cluster).
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "baseline",
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "baseline"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := helm(t, kc, "install", "aether", ChartDir, "--namespace", "baseline", "--dry-run=server")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`enforces Pod Security "baseline"`, "pod-security.kubernetes.io/enforce=privileged", "cluster and registry.endpoints are required",
		"no ClusterSPIFFEID CRD", "no default StorageClass", "spire-server agent list"} {
		if !strings.Contains(out, w) {
			t.Errorf("helm install into a baseline namespace, unconfigured: NOTES do not say %q:\n%s", w, out)
		}
	}
	install := []string{"--namespace", ns, "--set", "cluster=east", "--set", "registry.endpoints={https://10.0.0.2:2379}"}
	out, err = helm(t, kc, append([]string{"install", "aether", ChartDir, "--dry-run=server", "--set", "identity.mode=dev-ca"}, install...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "create secret tls aether-ca") || strings.Contains(out, "WARNING") || strings.Contains(out, "SPIRE") {
		t.Errorf("helm install --set identity.mode=dev-ca NOTES do not name the missing CA Secret, or warn of a configured value, or speak of SPIRE:\n%s", out)
	}

	// sharedTrustDomain: an upstream authority Secret of type kubernetes.io/tls (which the
	// registrar caches) is refused, and so is one without the keys SPIRE reads.
	const uns = "spire-shared-check"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: uns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	shared := append([]string{"install", "aether", ChartDir, "--dry-run=server", "--set", "spire.namespace=" + uns, "--set", "spire.createNamespace=false",
		"--set", "spire.clusterset.mode=sharedTrustDomain"}, install...)
	for _, c := range []struct {
		secret *corev1.Secret
		want   string
	}{
		{&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "spire-upstream-authority"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": []byte("c"), "tls.key": []byte("k")}}, "a kubernetes.io/tls Secret"},
		{&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "spire-upstream-authority"},
			Data: map[string][]byte{"upstream-ca.crt": []byte("c")}}, "has no key upstream-ca.key"},
	} {
		_ = cs.CoreV1().Secrets(uns).Delete(ctx, c.secret.Name, metav1.DeleteOptions{})
		if _, err := cs.CoreV1().Secrets(uns).Create(ctx, c.secret, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := helm(t, kc, shared...); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "spire.clusterset.upstreamAuthority.secretName") {
			t.Errorf("helm install with the upstream authority Secret %v: %v, want a refusal naming the value and saying %q", c.secret.Data, err, c.want)
		}
	}

	if _, err := cs.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "standard",
		Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}}, Provisioner: "example.org/none"}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err = helm(t, kc, append([]string{"install", "aether", ChartDir}, install...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install:\n%s", out)
	if strings.Contains(out, "create secret tls aether-ca") || strings.Contains(out, "WARNING") || !strings.Contains(out, "rollout status statefulset/spire-server") {
		t.Errorf("helm install NOTES name a CA Secret SPIRE does not need, or warn of a configured value, or do not say how to check SPIRE:\n%s", out)
	}
	crds, err := ext.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var installed []string
	for _, c := range crds.Items {
		installed = append(installed, c.Name)
		if c.Name == "gatewayclasses.gateway.networking.k8s.io" && c.Labels["app.kubernetes.io/managed-by"] == "Helm" {
			t.Errorf("helm install took over the existing CRD %s", c.Name)
		}
	}
	if len(installed) != 17 {
		t.Errorf("CRDs after helm install: %v, want the 17 of MCS, Gateway API, aether (AuthorizationPolicy, PeerAuthentication) and SPIRE", installed)
	}
	// SPIRE: its namespace (the chart's), server, agents and the ClusterSPIFFEIDs (their CRD
	// created by helm install before it rendered them).
	sns, err := cs.CoreV1().Namespaces().Get(ctx, "spire", metav1.GetOptions{})
	if err != nil || sns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Fatalf("namespace spire after helm install: %v (labels %v), want it, privileged", err, sns.Labels)
	}
	sts, err := cs.AppsV1().StatefulSets("spire").Get(ctx, "spire-server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AppsV1().DaemonSets("spire").Get(ctx, "spire-agent", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(api.Config)
	spiffeIDs := dyn.Resource(schema.GroupVersionResource{Group: "spire.spiffe.io", Version: "v1alpha1", Resource: "clusterspiffeids"})
	for _, n := range []string{"aether-workloads", "aether-agent"} {
		if _, err := spiffeIDs.Get(ctx, n, metav1.GetOptions{}); err != nil {
			t.Errorf("ClusterSPIFFEID %s after helm install: %v", n, err)
		}
	}
	// The SPIRE server's k8sbundle notifier writes the bundle into spire-bundle (as the server
	// would, with a patch of its own); an upgrade must keep it.
	const bundle = "-----BEGIN CERTIFICATE-----\nMIIB (a bundle)\n-----END CERTIFICATE-----\n"
	if _, err := cs.CoreV1().ConfigMaps("spire").Patch(ctx, "spire-bundle", types.StrategicMergePatchType,
		[]byte(`{"data":{"bundle.crt":`+strconv.Quote(bundle)+`}}`), metav1.PatchOptions{FieldManager: "spire-server"}); err != nil {
		t.Fatal(err)
	}
	ds, err := cs.AppsV1().DaemonSets(ns).Get(ctx, "aether-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "aether-config", metav1.GetOptions{})
	if err != nil || cm.Data["AETHER_CLUSTER"] != "east" {
		t.Fatalf("aether-config after install: %v %v", cm.Data, err)
	}
	if _, err := cs.AppsV1().Deployments(ns).Get(ctx, "aether-registrar", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}

	// Upgrade with another value: the ConfigMap follows, and so do the pods' checksum.
	if _, err := helm(t, kc, "upgrade", "aether", ChartDir, "--namespace", ns, "--reuse-values", "--set", "logLevel=debug"); err != nil {
		t.Fatal(err)
	}
	cm, err = cs.CoreV1().ConfigMaps(ns).Get(ctx, "aether-config", metav1.GetOptions{})
	if err != nil || cm.Data["AETHER_LOG_LEVEL"] != "debug" || cm.Data["AETHER_CLUSTER"] != "east" {
		t.Errorf("aether-config after upgrade: %v %v; want AETHER_LOG_LEVEL debug, the cluster kept", cm.Data, err)
	}
	ds2, err := cs.AppsV1().DaemonSets(ns).Get(ctx, "aether-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := ds.Spec.Template.Annotations["checksum/config"], ds2.Spec.Template.Annotations["checksum/config"]; a == b {
		t.Errorf("checksum/config unchanged by the upgrade (%s): the pods would keep the old settings", a)
	}
	// SPIRE logs at the chart's level: its configuration changed, so do its pods' checksum.
	sts2, err := cs.AppsV1().StatefulSets("spire").Get(ctx, "spire-server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := sts.Spec.Template.Annotations["checksum/config"], sts2.Spec.Template.Annotations["checksum/config"]; a == "" || a == b {
		t.Errorf("spire-server checksum/config %q before the upgrade, %q after: want a change (logLevel is SPIRE's too)", a, b)
	}
	if cm, err := cs.CoreV1().ConfigMaps("spire").Get(ctx, "spire-bundle", metav1.GetOptions{}); err != nil || cm.Data["bundle.crt"] != bundle {
		t.Errorf("spire-bundle after helm upgrade: %v (%v), want the bundle the server wrote kept", cm.Data, err)
	}

	// Removal: cniUninstall is refused while the agent DaemonSet exists.
	_, err = helm(t, kc, "upgrade", "aether", ChartDir, "--namespace", ns, "--reuse-values", "--set", "cniUninstall=true")
	if err == nil || !strings.Contains(err.Error(), "cniUninstall true while DaemonSet "+ns+"/aether-agent exists") {
		t.Fatalf("cniUninstall with the agent DaemonSet in place: %v, want a refusal naming it", err)
	}
	// No kube-controller-manager here: the DaemonSet has no pods, and a plain delete removes it.
	if err := cs.AppsV1().DaemonSets(ns).Delete(ctx, "aether-agent", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err = helm(t, kc, "upgrade", "aether", ChartDir, "--namespace", ns, "--reuse-values", "--set", "cniUninstall=true")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "rollout status daemonset/aether-cni-uninstall") {
		t.Errorf("cniUninstall NOTES do not say what to wait for:\n%s", out)
	}
	if _, err := cs.AppsV1().DaemonSets(ns).Get(ctx, "aether-cni-uninstall", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AppsV1().DaemonSets(ns).Get(ctx, "aether-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("agent DaemonSet after cniUninstall: %v, want not found", err)
	}

	if _, err := helm(t, kc, "uninstall", "aether", "--namespace", ns); err != nil {
		t.Fatal(err)
	}
	var left []string
	check := func(what string, err error) {
		if !apierrors.IsNotFound(err) {
			left = append(left, fmt.Sprintf("%s (%v)", what, err))
		}
	}
	_, err = cs.AppsV1().DaemonSets(ns).Get(ctx, "aether-cni-uninstall", metav1.GetOptions{})
	check("DaemonSet aether-cni-uninstall", err)
	_, err = cs.AppsV1().Deployments(ns).Get(ctx, "aether-registrar", metav1.GetOptions{})
	check("Deployment aether-registrar", err)
	_, err = cs.CoreV1().ConfigMaps(ns).Get(ctx, "aether-config", metav1.GetOptions{})
	check("ConfigMap aether-config", err)
	_, err = cs.RbacV1().ClusterRoles().Get(ctx, "aether-agent", metav1.GetOptions{})
	check("ClusterRole aether-agent", err)
	_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "aether-agent-node-pods", metav1.GetOptions{})
	check("ValidatingAdmissionPolicy aether-agent-node-pods", err)
	_, err = cs.RbacV1().ClusterRoles().Get(ctx, "aether-spire-server", metav1.GetOptions{})
	check("ClusterRole aether-spire-server", err)
	_, err = spiffeIDs.Get(ctx, "aether-workloads", metav1.GetOptions{})
	check("ClusterSPIFFEID aether-workloads", err)
	// No namespace controller runs here: SPIRE's namespace is being deleted, not gone.
	if n, err := cs.CoreV1().Namespaces().Get(ctx, "spire", metav1.GetOptions{}); err == nil && n.DeletionTimestamp == nil {
		left = append(left, "Namespace spire")
	} else if err != nil {
		check("Namespace spire", err)
	}
	if len(left) > 0 {
		t.Errorf("helm uninstall left %v", left)
	}
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "httproutes.gateway.networking.k8s.io", metav1.GetOptions{}); err != nil {
		t.Errorf("helm uninstall removed the CRDs (and every route with them): %v", err)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		t.Errorf("namespace %s after helm uninstall: %v, want it kept (it is not the release's)", ns, err)
	}
}
