package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/aethermesh/aether/internal/testenv"
)

// spireRender is what the chart renders for SPIRE (identity.mode spire): the objects, and the
// configuration files decoded as the pods read them, after the expansion -expandEnv (and the
// Controller Manager's -expand-env) makes with the ConfigMap aether-spire-settings.
type spireRender struct {
	objs     []*unstructured.Unstructured
	settings map[string]string
	// raw are the configuration files as rendered (server.conf, agent.conf, config.yaml).
	raw                  map[string]string
	server, agent        map[string]any // server.conf and agent.conf (JSON)
	controllerManager    map[string]any // the Controller Manager's config.yaml
	statefulSet          appsv1.StatefulSet
	daemonSet            appsv1.DaemonSet
	serverC, cmC, agentC corev1.Container
}

// at returns the value at path in the decoded configuration m (nil when absent).
func at(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[p]
	}
	return v
}

// renderSPIRE renders the chart in namespace with values and args, and decodes what it renders
// for SPIRE in SPIRE's namespace ns (spire.namespace).
func renderSPIRE(t *testing.T, namespace, ns, values string, args ...string) spireRender {
	t.Helper()
	r := spireRender{objs: render(t, namespace, values, args...), raw: map[string]string{}}
	for _, o := range r.objs {
		if (o.GetKind() == "StatefulSet" || o.GetKind() == "DaemonSet" || o.GetKind() == "ConfigMap" || o.GetKind() == "Service") &&
			strings.HasPrefix(o.GetName(), "spire") && o.GetNamespace() != ns {
			t.Errorf("%s %s in namespace %q, want SPIRE's %s", o.GetKind(), o.GetName(), o.GetNamespace(), ns)
		}
	}
	var settings, server, agent, cm corev1.ConfigMap
	object(t, r.objs, "ConfigMap", "aether-spire-settings", &settings)
	object(t, r.objs, "ConfigMap", "spire-server", &server)
	object(t, r.objs, "ConfigMap", "spire-agent", &agent)
	object(t, r.objs, "ConfigMap", "spire-controller-manager", &cm)
	r.settings = settings.Data
	expand := func(s string) string { return os.Expand(s, func(k string) string { return r.settings[k] }) }
	for _, f := range []struct {
		cm   corev1.ConfigMap
		key  string
		out  *map[string]any
		yaml bool
	}{{server, "server.conf", &r.server, false}, {agent, "agent.conf", &r.agent, false}, {cm, "config.yaml", &r.controllerManager, true}} {
		raw, ok := f.cm.Data[f.key]
		if !ok {
			t.Fatalf("ConfigMap %s has no %s", f.cm.Name, f.key)
		}
		r.raw[f.key] = raw
		var err error
		if f.yaml {
			err = yaml.UnmarshalStrict([]byte(expand(raw)), f.out)
		} else {
			d := json.NewDecoder(strings.NewReader(expand(raw)))
			err = d.Decode(f.out)
		}
		if err != nil {
			t.Fatalf("ConfigMap %s %s: %v\n%s", f.cm.Name, f.key, err, raw)
		}
	}
	object(t, r.objs, "StatefulSet", "spire-server", &r.statefulSet)
	object(t, r.objs, "DaemonSet", "spire-agent", &r.daemonSet)
	var err error
	if r.serverC, err = Container(r.statefulSet.Spec.Template.Spec, "spire-server"); err != nil {
		t.Fatal(err)
	}
	if r.cmC, err = Container(r.statefulSet.Spec.Template.Spec, "controller-manager"); err != nil {
		t.Fatal(err)
	}
	if r.agentC, err = Container(r.daemonSet.Spec.Template.Spec, "spire-agent"); err != nil {
		t.Fatal(err)
	}
	return r
}

// validate runs `spire-server validate` and `spire-agent validate` (SPIRE's own parsers of the
// whole file and of every section but the plugins' data) on the rendered files with -expandEnv
// and the settings as environment, as the pods run them.
func (r spireRender) validate(t *testing.T) {
	t.Helper()
	tl := testenv.RequireTools(t, testenv.ToolSPIRE)
	dir := t.TempDir()
	env := os.Environ()
	for k, v := range r.settings {
		env = append(env, k+"="+v)
	}
	for _, c := range []struct{ bin, file, want string }{
		{tl.SPIREServer, "server.conf", "SPIRE server configuration file is valid."},
		{tl.SPIREAgent, "agent.conf", "SPIRE agent configuration file is valid."},
	} {
		p := filepath.Join(dir, c.file)
		if err := os.WriteFile(p, []byte(r.raw[c.file]), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(c.bin, "validate", "-config", p, "-expandEnv")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s validate -config %s -expandEnv: %v\n%s", filepath.Base(c.bin), c.file, err, out)
		}
	}
}

// spiffeID renders the ClusterSPIFFEID template tmpl as the Controller Manager does (Go
// text/template) for a pod of namespace ns running as serviceAccount.
func spiffeID(t *testing.T, tmpl, trustDomain, ns, serviceAccount string) string {
	t.Helper()
	tp, err := template.New("id").Option("missingkey=error").Parse(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := tp.Execute(&b, map[string]any{"TrustDomain": trustDomain, "PodMeta": &metav1.ObjectMeta{Namespace: ns},
		"PodSpec": &corev1.PodSpec{ServiceAccountName: serviceAccount}}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestChartSPIREValues renders the chart with OtherSPIREValues in namespace mesh-system and checks
// that each SPIRE value lands where it should and that the pieces fit each other: the settings
// (cluster, trust domain); the server's configuration (TTLs, key manager, k8s_psat for this
// cluster with the agents' ServiceAccount alone, the bundle ConfigMap the agents mount, the API
// socket the Controller Manager dials on a volume both mount, the data directory on the data
// volume, the health port the probes ask); the agents' (the server's Service and port, the
// projected token of the audience k8s_psat expects, the kubelet on the node's IP with its
// certificate verified, the admin and Workload API sockets on the node's /run/spire, the
// authorized delegate: the ID the ClusterSPIFFEID aether-agent renders for the aether agent's own
// pods); the Controller Manager's (className, ignored namespaces anchored and SPIRE's own added);
// the ClusterSPIFFEIDs' selectors; images, resources, scheduling and pull Secrets; and SPIRE's
// binaries accept both configuration files. The aether agent DaemonSet asks SPIRE for SVIDs and
// holds no CA.
func TestChartSPIREValues(t *testing.T) {
	const ns, sns, td = "mesh-system", "identity", "example.org"
	r := renderSPIRE(t, ns, sns, OtherSPIREValues)
	r.validate(t)
	if hasObject(r.objs, "Namespace", sns) {
		t.Errorf("spire.createNamespace false: Namespace %s rendered", sns)
	}
	if want := map[string]string{"AETHER_CLUSTER": "east", "AETHER_TRUST_DOMAIN": td}; !maps.Equal(r.settings, want) {
		t.Errorf("aether-spire-settings %v, want %v", r.settings, want)
	}
	for _, c := range []corev1.Container{r.serverC, r.cmC, r.agentC} {
		if len(c.EnvFrom) != 1 || c.EnvFrom[0].ConfigMapRef == nil || c.EnvFrom[0].ConfigMapRef.Name != "aether-spire-settings" {
			t.Errorf("container %s: envFrom %+v, want the ConfigMap aether-spire-settings (its config expands them)", c.Name, c.EnvFrom)
		}
	}
	if !slices.Contains(r.serverC.Args, "-expandEnv") || !slices.Contains(r.agentC.Args, "-expandEnv") || !slices.Contains(r.cmC.Args, "-expand-env") {
		t.Errorf("args %q, %q, %q: want the settings expanded (-expandEnv, -expand-env)", r.serverC.Args, r.agentC.Args, r.cmC.Args)
	}

	// The server.
	sspec := r.statefulSet.Spec.Template.Spec
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"trust domain", at(r.server, "server", "trust_domain"), td},
		{"ca_ttl", at(r.server, "server", "ca_ttl"), "48h"},
		{"default_x509_svid_ttl", at(r.server, "server", "default_x509_svid_ttl"), "30m"},
		{"cache_reload_interval", at(r.server, "server", "experimental", "cache_reload_interval"), "250ms"},
		{"events_based_cache", at(r.server, "server", "experimental", "events_based_cache"), true},
		{"log level", at(r.server, "server", "log_level"), "DEBUG"},
		{"key manager", slices.Collect(maps.Keys(at(r.server, "plugins", "KeyManager").(map[string]any))), []string{"memory"}},
		{"k8s_psat clusters", at(r.server, "plugins", "NodeAttestor", "k8s_psat", "plugin_data", "clusters"),
			map[string]any{"east": map[string]any{"service_account_allow_list": []any{sns + ":" + r.daemonSet.Spec.Template.Spec.ServiceAccountName}}}},
		{"k8sbundle", at(r.server, "plugins", "Notifier", "k8sbundle", "plugin_data"),
			map[string]any{"namespace": sns, "config_map": "spire-bundle", "config_map_key": "bundle.crt"}},
		{"datastore", at(r.server, "plugins", "DataStore", "sql", "plugin_data", "database_type"), "sqlite3"},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("server.conf %s: %v, want %v", c.what, c.got, c.want)
		}
	}
	dataDir, _ := at(r.server, "server", "data_dir").(string)
	db, _ := at(r.server, "plugins", "DataStore", "sql", "plugin_data", "connection_string").(string)
	if v, m, _, err := MountedFrom(sspec, r.serverC, dataDir); err != nil || v.Name != "data" || m.ReadOnly || v.EmptyDir == nil ||
		v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Cmp(resource.MustParse("256Mi")) != 0 || !strings.HasPrefix(db, dataDir+"/") {
		t.Errorf("data_dir %s (datastore %s): volume %+v mount %+v (%v); want the writable emptyDir data of 256Mi, the datastore in it", dataDir, db, v, m, err)
	}
	if len(r.statefulSet.Spec.VolumeClaimTemplates) != 0 {
		t.Errorf("dataVolume.type emptyDir: volumeClaimTemplates %v", r.statefulSet.Spec.VolumeClaimTemplates)
	}
	sock, _ := at(r.server, "server", "socket_path").(string)
	if at(r.controllerManager, "spireServerSocketPath") != sock {
		t.Errorf("the Controller Manager dials %v, the server listens on %s", at(r.controllerManager, "spireServerSocketPath"), sock)
	}
	vs, ms, _, err1 := MountedFrom(sspec, r.serverC, filepath.Dir(sock))
	vc, mc, _, err2 := MountedFrom(sspec, r.cmC, filepath.Dir(sock))
	if err1 != nil || err2 != nil || vs.Name != vc.Name || vs.EmptyDir == nil || ms.ReadOnly || ms.MountPath != mc.MountPath {
		t.Errorf("the server API socket's directory %s: %s at %s in the server, %s at %s in the Controller Manager (%v, %v); want one emptyDir at one path",
			filepath.Dir(sock), vs.Name, ms.MountPath, vc.Name, mc.MountPath, err1, err2)
	}
	probePort := func(c corev1.Container, p *corev1.Probe) string {
		if p == nil || p.HTTPGet == nil {
			return ""
		}
		if p.HTTPGet.Port.StrVal == "" {
			return p.HTTPGet.Port.String()
		}
		for _, cp := range c.Ports {
			if cp.Name == p.HTTPGet.Port.StrVal {
				return resource.NewQuantity(int64(cp.ContainerPort), resource.DecimalSI).String()
			}
		}
		return "?" + p.HTTPGet.Port.StrVal
	}
	if hp := at(r.server, "health_checks", "bind_port"); probePort(r.serverC, r.serverC.ReadinessProbe) != hp || probePort(r.serverC, r.serverC.LivenessProbe) != hp ||
		r.serverC.ReadinessProbe.HTTPGet.Path != at(r.server, "health_checks", "ready_path") {
		t.Errorf("server probes on %s and %s, health_checks on %v", probePort(r.serverC, r.serverC.ReadinessProbe), probePort(r.serverC, r.serverC.LivenessProbe), hp)
	}
	if hp := strings.TrimPrefix(at(r.controllerManager, "health", "healthProbeBindAddress").(string), "0.0.0.0:"); probePort(r.cmC, r.cmC.ReadinessProbe) != hp {
		t.Errorf("controller-manager readiness probe on %s, its health on %s", probePort(r.cmC, r.cmC.ReadinessProbe), hp)
	}
	var svc corev1.Service
	object(t, r.objs, "Service", "spire-server", &svc)
	svcSel := labels.SelectorFromSet(svc.Spec.Selector)
	if len(svc.Spec.Ports) != 1 || probePort(r.serverC, &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
		HTTPGet: &corev1.HTTPGetAction{Port: svc.Spec.Ports[0].TargetPort}}}) != at(r.server, "server", "bind_port") ||
		svcSel.Empty() || !svcSel.Matches(labels.Set(r.statefulSet.Spec.Template.Labels)) {
		t.Errorf("Service spire-server %+v does not lead to the server's bind_port %v", svc.Spec, at(r.server, "server", "bind_port"))
	}

	// The agents.
	aspec := r.daemonSet.Spec.Template.Spec
	delegate := spiffeID(t, clusterSPIFFEID(t, r.objs, "aether-agent").spiffeIDTemplate, td, ns, "aether-agent")
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"trust domain", at(r.agent, "agent", "trust_domain"), td},
		{"server", at(r.agent, "agent", "server_address"), "spire-server." + sns + ".svc"},
		{"server port", at(r.agent, "agent", "server_port"), resource.NewQuantity(int64(svc.Spec.Ports[0].Port), resource.DecimalSI).String()},
		{"authorized delegates", at(r.agent, "agent", "authorized_delegates"), []any{delegate}},
		{"sync_interval", at(r.agent, "agent", "experimental", "sync_interval"), "300ms"},
		{"k8s_psat cluster", at(r.agent, "plugins", "NodeAttestor", "k8s_psat", "plugin_data", "cluster"), "east"},
		{"kubelet verification", at(r.agent, "plugins", "WorkloadAttestor", "k8s", "plugin_data", "skip_kubelet_verification"), false},
		{"log level", at(r.agent, "agent", "log_level"), "DEBUG"},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("agent.conf %s: %v, want %v", c.what, c.got, c.want)
		}
	}
	if delegate != "spiffe://"+td+"/ns/"+ns+"/sa/aether-agent" {
		t.Errorf("the aether agents' ID %s, want the mesh's form for their ServiceAccount", delegate)
	}
	tokenPath, _ := at(r.agent, "plugins", "NodeAttestor", "k8s_psat", "plugin_data", "token_path").(string)
	if v, _, key, err := MountedFrom(aspec, r.agentC, tokenPath); err != nil || v.Projected == nil || len(v.Projected.Sources) != 1 ||
		v.Projected.Sources[0].ServiceAccountToken == nil || v.Projected.Sources[0].ServiceAccountToken.Path != key ||
		v.Projected.Sources[0].ServiceAccountToken.Audience != "spire-server" {
		t.Errorf("k8s_psat token %s: volume %+v (%v); want a projected ServiceAccount token of audience spire-server (k8s_psat's default)", tokenPath, v, err)
	}
	bundle, _ := at(r.agent, "agent", "trust_bundle_path").(string)
	if v, _, key, err := MountedFrom(aspec, r.agentC, bundle); err != nil || v.ConfigMap == nil || v.ConfigMap.Name != "spire-bundle" || key != "bundle.crt" {
		t.Errorf("trust_bundle_path %s: volume %+v key %q (%v); want the key bundle.crt of the ConfigMap spire-bundle the server writes", bundle, v, key, err)
	}
	kenv := at(r.agent, "plugins", "WorkloadAttestor", "k8s", "plugin_data", "node_name_env")
	if !slices.ContainsFunc(r.agentC.Env, func(e corev1.EnvVar) bool {
		return e.Name == kenv && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP"
	}) {
		t.Errorf("the k8s workload attestor's kubelet is $%v, which the container does not set to status.hostIP: %+v", kenv, r.agentC.Env)
	}
	for p, host := range map[string]string{at(r.agent, "agent", "admin_socket_path").(string): "/run/spire/agent-admin",
		at(r.agent, "agent", "socket_path").(string): "/run/spire/agent-sockets"} {
		v, m, rel, err := MountedFrom(aspec, r.agentC, p)
		if err != nil || v.HostPath == nil || m.ReadOnly || filepath.Dir(filepath.Join(v.HostPath.Path, rel)) != host {
			t.Errorf("socket %s: volume %+v (%v); want the node's %s, writable", p, v, err, host)
		}
	}
	if hp := at(r.agent, "health_checks", "bind_port"); probePort(r.agentC, r.agentC.ReadinessProbe) != hp || r.agentC.ReadinessProbe.HTTPGet.Host != at(r.agent, "health_checks", "bind_address") {
		t.Errorf("agent probes on %s:%s, health_checks on %v:%v", r.agentC.ReadinessProbe.HTTPGet.Host, probePort(r.agentC, r.agentC.ReadinessProbe),
			at(r.agent, "health_checks", "bind_address"), hp)
	}
	if !aspec.HostNetwork || !aspec.HostPID || aspec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("spire-agent: hostNetwork %v, hostPID %v, dnsPolicy %s; want the node's network and PIDs, cluster DNS", aspec.HostNetwork, aspec.HostPID, aspec.DNSPolicy)
	}

	// The Controller Manager and the ClusterSPIFFEIDs.
	if got := at(r.controllerManager, "ignoreNamespaces"); !reflect.DeepEqual(got, []any{"^kube-system$", "^legacy$", "^" + sns + "$"}) {
		t.Errorf("ignoreNamespaces %v, want the values' and SPIRE's namespace, each anchored", got)
	}
	for k, want := range map[string]any{"className": "mesh", "clusterName": "east", "trustDomain": td, "logLevel": "debug"} {
		if got := at(r.controllerManager, k); got != want {
			t.Errorf("Controller Manager %s: %v, want %v", k, got, want)
		}
	}
	wl := clusterSPIFFEID(t, r.objs, "aether-workloads")
	ag := clusterSPIFFEID(t, r.objs, "aether-agent")
	if wl.className != "mesh" || ag.className != "mesh" {
		t.Errorf("ClusterSPIFFEIDs of className %q and %q, want the Controller Manager's mesh", wl.className, ag.className)
	}
	if got := spiffeID(t, wl.spiffeIDTemplate, td, "shop", "web"); got != "spiffe://"+td+"/ns/shop/sa/web" {
		t.Errorf("aether-workloads renders %s for shop/web, want the mesh's spiffe://%s/ns/shop/sa/web", got, td)
	}
	wantNS := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "mesh.example/tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"gold"}}}}
	if !equality.Semantic.DeepEqual(wl.namespaceSelector, wantNS) || !equality.Semantic.DeepEqual(wl.podSelector, metav1.LabelSelector{MatchLabels: map[string]string{"mesh.example/identity": "spire"}}) {
		t.Errorf("aether-workloads selectors %+v / %+v, want the values'", wl.namespaceSelector, wl.podSelector)
	}
	var ads appsv1.DaemonSet
	object(t, r.objs, "DaemonSet", "aether-agent", &ads)
	sel, err := metav1.LabelSelectorAsSelector(&ag.podSelector)
	if err != nil || !sel.Matches(labels.Set(ads.Spec.Template.Labels)) || ag.namespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != ns ||
		ads.Spec.Template.Spec.ServiceAccountName != "aether-agent" {
		t.Errorf("ClusterSPIFFEID aether-agent selects %+v in %+v; the aether agent's pods are %v in %s as %s", ag.podSelector, ag.namespaceSelector,
			ads.Spec.Template.Labels, ns, ads.Spec.Template.Spec.ServiceAccountName)
	}

	// The aether agent: SVIDs from SPIRE, no CA Secret.
	agentC, err := Container(ads.Spec.Template.Spec, "agent")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(agentC.Args, "--identity-source=spire") || slices.ContainsFunc(agentC.Args, func(a string) bool { return strings.HasPrefix(a, "--ca-") }) {
		t.Errorf("aether agent args %q: want --identity-source=spire and no CA", agentC.Args)
	}
	for _, v := range ads.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "aether-ca" {
			t.Errorf("aether agent pods mount the CA Secret (volume %s) in spire mode", v.Name)
		}
	}

	// Images, resources, scheduling, pull Secrets; RBAC subjects in SPIRE's namespace.
	for _, c := range []struct {
		c         corev1.Container
		image     string
		policy    corev1.PullPolicy
		resources corev1.ResourceRequirements
	}{
		{r.serverC, "registry.example/spire/server@" + otherSPIREDigest, corev1.PullIfNotPresent,
			corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "256Mi"), Limits: rl("memory", "1Gi")}},
		{r.cmC, "registry.example:5000/spire/controller-manager:v0.6.3", corev1.PullNever,
			corev1.ResourceRequirements{Requests: rl("cpu", "30m", "memory", "96Mi"), Limits: rl("memory", "384Mi")}},
		{r.agentC, "registry.example/spire/agent:1.13.3", corev1.PullAlways,
			corev1.ResourceRequirements{Requests: rl("cpu", "40m", "memory", "80Mi"), Limits: rl("memory", "256Mi")}},
	} {
		if c.c.Image != c.image || c.c.ImagePullPolicy != c.policy || !equality.Semantic.DeepEqual(c.c.Resources, c.resources) {
			t.Errorf("container %s: image %s (%s), resources %v; want %s (%s), %v", c.c.Name, c.c.Image, c.c.ImagePullPolicy, c.c.Resources, c.image, c.policy, c.resources)
		}
	}
	pull := []corev1.LocalObjectReference{{Name: "regcred"}}
	if !reflect.DeepEqual(sspec.NodeSelector, map[string]string{"node-role.example/control": "true"}) || len(sspec.Tolerations) != 1 || sspec.Tolerations[0].Key != "control" ||
		!reflect.DeepEqual(sspec.ImagePullSecrets, pull) {
		t.Errorf("spire-server pods: nodeSelector %v, tolerations %v, pull Secrets %v; want the values'", sspec.NodeSelector, sspec.Tolerations, sspec.ImagePullSecrets)
	}
	if !reflect.DeepEqual(aspec.NodeSelector, ads.Spec.Template.Spec.NodeSelector) || !reflect.DeepEqual(aspec.Tolerations, ads.Spec.Template.Spec.Tolerations) ||
		aspec.PriorityClassName != "mesh-node" || !reflect.DeepEqual(aspec.ImagePullSecrets, pull) {
		t.Errorf("spire-agent pods: nodeSelector %v, tolerations %v, priority %q; want the aether agent's %v, %v, mesh-node",
			aspec.NodeSelector, aspec.Tolerations, aspec.PriorityClassName, ads.Spec.Template.Spec.NodeSelector, ads.Spec.Template.Spec.Tolerations)
	}
	for _, name := range []string{"aether-spire-server", "aether-spire-agent"} {
		var crb rbacv1.ClusterRoleBinding
		object(t, r.objs, "ClusterRoleBinding", name, &crb)
		if len(crb.Subjects) != 1 || crb.Subjects[0].Namespace != sns {
			t.Errorf("ClusterRoleBinding %s: subjects %+v, want a ServiceAccount of %s", name, crb.Subjects, sns)
		}
	}

	// A changed SPIRE setting rolls SPIRE's pods.
	defaults := renderSPIRE(t, "aether-system", "spire", "")
	for _, p := range []struct{ a, b map[string]string }{
		{r.statefulSet.Spec.Template.Annotations, defaults.statefulSet.Spec.Template.Annotations},
		{r.daemonSet.Spec.Template.Annotations, defaults.daemonSet.Spec.Template.Annotations},
	} {
		if p.a["checksum/config"] == "" || p.a["checksum/config"] == p.b["checksum/config"] {
			t.Errorf("checksum/config %q, the defaults' %q: want one that follows SPIRE's configuration", p.a["checksum/config"], p.b["checksum/config"])
		}
	}
}

// TestChartSPIREDefaults renders the chart's defaults (as deploy/ holds them) and variants: the
// server keeps its CA key on disk in its data volume, a volume claim of the values' size and
// class; SPIRE alone (mesh.enabled false) renders SPIRE's objects and none of aether's; dev-ca
// renders no SPIRE object.
func TestChartSPIREDefaults(t *testing.T) {
	r := renderSPIRE(t, "aether-system", "spire", "", "--set", "spire.server.dataVolume.storageClassName=fast", "--set", "spire.server.dataVolume.size=5Gi")
	r.validate(t)
	keys, _ := at(r.server, "plugins", "KeyManager", "disk", "plugin_data", "keys_path").(string)
	dataDir, _ := at(r.server, "server", "data_dir").(string)
	if !strings.HasPrefix(keys, dataDir+"/") || at(r.server, "server", "ca_ttl") != "24h" || at(r.server, "server", "default_x509_svid_ttl") != "1h" {
		t.Errorf("server.conf: keys %q in data_dir %q, ca_ttl %v, SVID TTL %v; want the disk key manager in the data volume, 24h, 1h", keys, dataDir,
			at(r.server, "server", "ca_ttl"), at(r.server, "server", "default_x509_svid_ttl"))
	}
	v, _, _, err := MountedFrom(r.statefulSet.Spec.Template.Spec, r.serverC, dataDir)
	vct := r.statefulSet.Spec.VolumeClaimTemplates
	if err == nil || v.Name != "" || len(vct) != 1 || vct[0].Name != "data" || vct[0].Spec.StorageClassName == nil || *vct[0].Spec.StorageClassName != "fast" ||
		vct[0].Spec.Resources.Requests.Storage().Cmp(resource.MustParse("5Gi")) != 0 {
		t.Errorf("data volume: pod volume %+v (%v), claim templates %+v; want only the claim template data of 5Gi, class fast", v, err, vct)
	}
	if !hasObject(r.objs, "Namespace", "spire") || !hasObject(r.objs, "ClusterSPIFFEID", "aether-workloads") {
		t.Error("the defaults render no Namespace spire or no ClusterSPIFFEID aether-workloads")
	}
	wl := clusterSPIFFEID(t, r.objs, "aether-workloads")
	if !reflect.DeepEqual(wl.namespaceSelector.MatchLabels, map[string]string{"aether.io/mesh": "enabled"}) {
		t.Errorf("aether-workloads selects namespaces %+v, want aether's meshed ones (aether.io/mesh=enabled)", wl.namespaceSelector)
	}

	only := render(t, "aether-system", "", "--set", "mesh.enabled=false")
	for _, o := range only {
		if strings.HasPrefix(o.GetName(), "aether-agent") && o.GetKind() != "ClusterSPIFFEID" || strings.HasPrefix(o.GetName(), "aether-registrar") ||
			o.GetName() == "aether-config" || o.GetKind() == "ValidatingAdmissionPolicy" {
			t.Errorf("mesh.enabled false renders %s %s", o.GetKind(), o.GetName())
		}
	}
	if !hasObject(only, "StatefulSet", "spire-server") || !hasObject(only, "DaemonSet", "spire-agent") || !hasObject(only, "ClusterSPIFFEID", "aether-agent") {
		t.Error("mesh.enabled false does not render SPIRE")
	}

	for _, o := range render(t, "aether-system", "", "--set", "identity.mode=dev-ca") {
		if o.GetNamespace() == "spire" || strings.Contains(o.GetName(), "spire") || o.GetKind() == "ClusterSPIFFEID" {
			t.Errorf("identity.mode dev-ca renders %s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
		}
	}
}

// renderedClusterSPIFFEID is what the tests read of a rendered ClusterSPIFFEID.
type renderedClusterSPIFFEID struct {
	className, spiffeIDTemplate    string
	namespaceSelector, podSelector metav1.LabelSelector
}

// clusterSPIFFEID decodes the ClusterSPIFFEID name among objs.
func clusterSPIFFEID(t *testing.T, objs []*unstructured.Unstructured, name string) renderedClusterSPIFFEID {
	t.Helper()
	var c struct {
		Spec struct {
			ClassName         string               `json:"className"`
			SPIFFEIDTemplate  string               `json:"spiffeIDTemplate"`
			NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`
			PodSelector       metav1.LabelSelector `json:"podSelector"`
		} `json:"spec"`
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
	}
	object(t, objs, "ClusterSPIFFEID", name, &c)
	return renderedClusterSPIFFEID{c.Spec.ClassName, c.Spec.SPIFFEIDTemplate, c.Spec.NamespaceSelector, c.Spec.PodSelector}
}

// TestChartSPIREConfigRuns runs SPIRE's real processes with the configuration files the chart
// renders by default (cluster alpha) against a real kube-apiserver holding the chart's objects,
// each as the ServiceAccount the chart gives it, so that the plugins' data (which `validate`
// does not read), the RBAC and the names that tie the pieces together are all checked: the
// SPIRE server publishes its bundle into spire-bundle (k8sbundle, as spire-server: the Role); the
// Controller Manager, as spire-server too, registers a meshed pod and an aether agent pod from the
// chart's ClusterSPIFFEIDs (spiffe://aether.internal/ns/shop/sa/default and
// .../ns/aether-system/sa/aether-agent, parent the node's agent) and writes their status; a SPIRE
// agent bootstraps from that bundle and attests with k8s_psat with a token of its
// ServiceAccount bound to its pod (the server's TokenReview, pod and node reads as spire-server).
// What the pod's mounts and in-cluster credentials give the processes is stood in for: the
// container paths are mapped to directories here, the listeners to loopback ports, and the
// in-cluster API client to a kubeconfig of the same ServiceAccount (kube_config_file and
// kube_config_file_path, the plugins' options for it), the automounted token of the SPIRE agent
// to a token file (token_path). The kubelet side (the k8s workload
// attestor) needs real nodes: TestPrivilegedSPIREOnRealNodes (e2e/mesh).
func TestChartSPIREConfigRuns(t *testing.T) {
	tl := testenv.RequireTools(t, testenv.ToolSPIRE)
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	cs := kubernetes.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const td, cluster = "aether.internal", "alpha"
	r := renderSPIRE(t, "aether-system", "spire", "", "--include-crds", "--set", "cluster="+cluster)

	// The chart's objects but the workloads, for real.
	crds := t.TempDir()
	for _, o := range r.objs {
		if o.GetKind() == "CustomResourceDefinition" {
			b, err := yaml.Marshal(o.Object)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(crds, o.GetName()+".yaml"), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	testenv.InstallCRDs(t, api.Config, crds)
	ap := newApplier(t, api)
	if err := ap.apply(&unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": "aether-system"}}}, false); err != nil {
		t.Fatal(err)
	}
	for _, o := range r.objs {
		switch o.GetKind() {
		case "CustomResourceDefinition", "StatefulSet", "DaemonSet", "Deployment":
			continue
		}
		if err := ap.apply(o, false); err != nil {
			t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	// A node, a meshed pod and an aether agent pod on it (no kubelet: only their objects).
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agentID := "spiffe://" + td + "/spire/agent/k8s_psat/" + cluster + "/" + string(node.UID)
	pod := func(ns, name, sa string, labels map[string]string) *corev1.Pod {
		t.Helper()
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		p, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: node.Name, ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "c"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop",
		Labels: map[string]string{"aether.io/mesh": "enabled"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	web := pod("shop", "web", "default", nil)
	aetherAgent := pod("aether-system", "aether-agent-x1", "aether-agent", map[string]string{"app.kubernetes.io/name": "aether-agent"})
	spireAgent := pod("spire", "spire-agent-x1", r.daemonSet.Spec.Template.Spec.ServiceAccountName, r.daemonSet.Spec.Template.Labels)

	// The ServiceAccounts' credentials: a kubeconfig of spire-server (the server and the
	// Controller Manager), the spire-agent pod's projected token.
	dir, err := os.MkdirTemp("", "chart-spire-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	kc, err := clientcmd.LoadFromFile(api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("spire").CreateToken(ctx, r.statefulSet.Spec.Template.Spec.ServiceAccountName, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		*ai = clientcmdapi.AuthInfo{Token: tr.Status.Token}
	}
	serverKubeconfig := filepath.Join(dir, "spire-server.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, serverKubeconfig); err != nil {
		t.Fatal(err)
	}
	var psat *corev1.ServiceAccountTokenProjection
	for _, v := range r.daemonSet.Spec.Template.Spec.Volumes {
		if v.Projected != nil && len(v.Projected.Sources) == 1 && v.Projected.Sources[0].ServiceAccountToken != nil {
			psat = v.Projected.Sources[0].ServiceAccountToken
		}
	}
	if psat == nil {
		t.Fatal("spire-agent: no projected ServiceAccount token")
	}
	atr, err := cs.CoreV1().ServiceAccounts("spire").CreateToken(ctx, spireAgent.Spec.ServiceAccountName, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		Audiences: []string{psat.Audience}, ExpirationSeconds: psat.ExpirationSeconds,
		BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: spireAgent.Name, UID: spireAgent.UID}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	env := []string{}
	for k, v := range r.settings {
		env = append(env, k+"="+v)
	}
	// Stand-ins for the pods' mounts and listeners: each container path under dir, loopback.
	serverPort, healthPort := testenv.FreePort(t), testenv.FreePort(t)
	paths := strings.NewReplacer("/var/lib/spire/server", dir+"/server", "/run/spire/server-api", dir+"/api", "/var/lib/spire/agent", dir+"/agent",
		"/run/spire/", dir+"/run/", "/etc/spire/bundle/bundle.crt", dir+"/bundle.crt", "/var/run/secrets/tokens/spire-agent", dir+"/psat")
	write := func(name, text string, edit func(map[string]any)) string {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal([]byte(paths.Replace(text)), &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	serverConf := write("server.conf", r.raw["server.conf"], func(m map[string]any) {
		s := m["server"].(map[string]any)
		s["bind_address"], s["bind_port"] = "127.0.0.1", strconv.Itoa(serverPort)
		h := m["health_checks"].(map[string]any)
		h["bind_address"], h["bind_port"] = "127.0.0.1", strconv.Itoa(healthPort)
		for _, c := range at(m, "plugins", "NodeAttestor", "k8s_psat", "plugin_data", "clusters").(map[string]any) {
			c.(map[string]any)["kube_config_file"] = serverKubeconfig
		}
		at(m, "plugins", "Notifier", "k8sbundle", "plugin_data").(map[string]any)["kube_config_file_path"] = serverKubeconfig
	})
	logs := t.TempDir()
	testenv.StartLogged(t, filepath.Join(logs, "spire-server.log"), env, tl.SPIREServer, "run", "-config", serverConf, "-expandEnv")
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"spire-server.log", "spire-controller-manager.log", "spire-agent.log"} {
				b, _ := os.ReadFile(filepath.Join(logs, f))
				t.Logf("%s (tail):\n%s", f, testenv.Tail(string(b), 5000))
			}
		}
	})
	serverSock := paths.Replace(at(r.server, "server", "socket_path").(string))
	spireServer := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, tl.SPIREServer, append(args, "-socketPath", serverSock)...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("spire-server %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	testenv.Eventually(t, time.Minute, "spire-server healthy", func() error { _, err := spireServer("healthcheck"); return err })
	var bundle string
	testenv.Eventually(t, time.Minute, "the bundle in spire-bundle (k8sbundle)", func() error {
		cm, err := cs.CoreV1().ConfigMaps("spire").Get(ctx, "spire-bundle", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if bundle = cm.Data["bundle.crt"]; !strings.Contains(bundle, "BEGIN CERTIFICATE") {
			return fmt.Errorf("spire-bundle data %v", cm.Data)
		}
		return nil
	})

	// The Controller Manager, as spire-server, registers the pods.
	cmConf := filepath.Join(dir, "controller-manager.yaml")
	if err := os.WriteFile(cmConf, []byte(strings.NewReplacer("/run/spire/server-api", dir+"/api",
		"0.0.0.0:8083", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))).Replace(r.raw["config.yaml"])), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.StartLogged(t, filepath.Join(logs, "spire-controller-manager.log"), append(env, "KUBECONFIG="+serverKubeconfig, "ENABLE_WEBHOOKS=false"),
		tl.SPIREControllerManager, "-config", cmConf, "-expand-env")
	for _, w := range []struct {
		pod *corev1.Pod
		id  string
	}{{web, "spiffe://" + td + "/ns/shop/sa/default"}, {aetherAgent, "spiffe://" + td + "/ns/aether-system/sa/aether-agent"}} {
		testenv.Eventually(t, time.Minute, "the entry of "+w.pod.Namespace+"/"+w.pod.Name, func() error {
			out, err := spireServer("entry", "show", "-selector", "k8s:pod-uid:"+string(w.pod.UID))
			if err != nil {
				return err
			}
			if !strings.Contains(out, "SPIFFE ID        : "+w.id+"\n") || !strings.Contains(out, "Parent ID        : "+agentID+"\n") {
				return fmt.Errorf("entry show: %s", out)
			}
			return nil
		})
	}
	if want := at(r.agent, "agent", "authorized_delegates"); !reflect.DeepEqual(want, []any{"spiffe://" + td + "/ns/aether-system/sa/aether-agent"}) {
		t.Errorf("authorized_delegates %v, want the aether agent pods' registered ID", want)
	}
	ids := dynamic.NewForConfigOrDie(api.Config).Resource(schema.GroupVersionResource{Group: "spire.spiffe.io", Version: "v1alpha1", Resource: "clusterspiffeids"})
	testenv.Eventually(t, time.Minute, "ClusterSPIFFEID status written", func() error {
		u, err := ids.Get(ctx, "aether-workloads", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n, _, _ := unstructured.NestedInt64(u.Object, "status", "stats", "podsSelected"); n != 1 {
			return fmt.Errorf("aether-workloads status %v, want 1 pod selected", u.Object["status"])
		}
		return nil
	})

	// A SPIRE agent bootstraps from the published bundle and attests with k8s_psat.
	for p, b := range map[string]string{dir + "/bundle.crt": bundle, dir + "/psat": atr.Status.Token} {
		if err := os.WriteFile(p, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The k8s workload attestor reads the pod's own token (automounted) when it is configured.
	if err := os.WriteFile(dir+"/sa-token", []byte(atr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	agentConf := write("agent.conf", r.raw["agent.conf"], func(m map[string]any) {
		a := m["agent"].(map[string]any)
		a["server_address"], a["server_port"] = "127.0.0.1", strconv.Itoa(serverPort)
		m["health_checks"].(map[string]any)["bind_port"] = strconv.Itoa(testenv.FreePort(t))
		at(m, "plugins", "WorkloadAttestor", "k8s", "plugin_data").(map[string]any)["token_path"] = dir + "/sa-token"
	})
	testenv.StartLogged(t, filepath.Join(logs, "spire-agent.log"), append(env, "KUBELET_HOST=127.0.0.1"), tl.SPIREAgent, "run", "-config", agentConf, "-expandEnv")
	workloadSock := paths.Replace(at(r.agent, "agent", "socket_path").(string))
	testenv.Eventually(t, time.Minute, "spire-agent attested and healthy", func() error {
		out, err := exec.CommandContext(ctx, tl.SPIREAgent, "healthcheck", "-socketPath", workloadSock).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	})
	out, err := spireServer("agent", "list")
	if err != nil || !strings.Contains(out, "SPIFFE ID         : "+agentID+"\n") || !strings.Contains(out, "Attestation type  : k8s_psat") {
		t.Errorf("spire-server agent list: %v\n%s\nwant %s attested with k8s_psat", err, out, agentID)
	}
	if _, err := os.Stat(paths.Replace(at(r.agent, "agent", "admin_socket_path").(string))); err != nil {
		t.Errorf("the admin socket: %v", err)
	}
}
