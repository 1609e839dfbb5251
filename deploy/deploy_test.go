package deploy

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestEveryManifestIsInstalled checks that every manifest under deploy/ is either a resource of
// kustomization.yaml, the configuration (config.yaml) or the uninstall step, and that every
// kustomization resource exists: a file nobody applies, or a missing one, fails.
func TestEveryManifestIsInstalled(t *testing.T) {
	files, err := Files()
	if err != nil {
		t.Fatal(err)
	}
	res, err := Kustomization()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if !slices.Contains(files, r) {
			t.Errorf("kustomization.yaml lists %s, which does not exist", r)
		}
	}
	for _, f := range files {
		if f != "kustomization.yaml" && f != Config && !strings.HasPrefix(f, "uninstall/") && !slices.Contains(res, f) {
			t.Errorf("%s is not in kustomization.yaml", f)
		}
	}
	if res[0] != "namespace.yaml" {
		t.Errorf("kustomization.yaml starts with %s, want namespace.yaml", res[0])
	}
}

// TestManifestsServerSideDryRun applies every manifest, in kustomization order, then config.yaml
// and the uninstall DaemonSet, to a real kube-apiserver with a server-side apply dry run and
// strict field validation (an unknown or misspelt field fails), after creating the namespace and
// the CRDs for real (namespaced objects need their namespace to exist even in a dry run). A
// mutated copy with an unknown field must fail, proving the validation is strict.
func TestManifestsServerSideDryRun(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	dyn, err := dynamic.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	apply := func(u *unstructured.Unstructured, dryRun bool) error {
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return err
		}
		b, err := json.Marshal(u.Object)
		if err != nil {
			return err
		}
		opts := metav1.PatchOptions{FieldManager: "aether-deploy-test", Force: new(true), FieldValidation: "Strict"}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		r := dyn.Resource(m.Resource)
		if u.GetNamespace() != "" {
			_, err = r.Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), types.ApplyPatchType, b, opts)
		} else {
			_, err = r.Patch(ctx, u.GetName(), types.ApplyPatchType, b, opts)
		}
		return err
	}
	ns, err := Objects("namespace.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range ns {
		if err := apply(o, false); err != nil {
			t.Fatalf("create namespace %s: %v", o.GetName(), err)
		}
	}

	res, err := Kustomization()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := Files()
	for _, f := range files {
		if strings.HasPrefix(f, "uninstall/") {
			res = append(res, f)
		}
	}
	res = append(res, Config)
	kinds := map[string]int{}
	for _, f := range res {
		objs, err := Objects(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(objs) == 0 {
			t.Errorf("%s: no objects", f)
		}
		for _, o := range objs {
			if err := apply(o, true); err != nil {
				t.Errorf("%s: dry-run apply %s %s: %v", f, o.GetKind(), o.GetName(), err)
				continue
			}
			kinds[o.GetKind()]++
		}
	}
	t.Logf("dry-run applied: %v", kinds)
	for _, k := range []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "DaemonSet", "Deployment", "ConfigMap"} {
		if kinds[k] == 0 {
			t.Errorf("no %s among the manifests", k)
		}
	}

	// Strictness: an unknown field in the DaemonSet's pod template is refused.
	objs, err := Objects("agent/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := objs[0].DeepCopy()
	if err := unstructured.SetNestedField(bad.Object, true, "spec", "template", "spec", "hostNetwrok"); err != nil {
		t.Fatal(err)
	}
	if err := apply(bad, true); err == nil || !strings.Contains(err.Error(), "hostNetwrok") {
		t.Errorf("dry-run apply with an unknown field: err %v, want a strict-validation error naming hostNetwrok", err)
	}
}

// TestAgentDaemonSetShape checks the properties of the agent's pod the design depends on, which
// a dry run accepts either way: host network with cluster DNS, Envoy as its own container
// sharing the state and socket volumes, netns mounts that follow the host's, the capabilities,
// the downward API values and the node paths the CNI install writes.
func TestAgentDaemonSetShape(t *testing.T) {
	var ds appsv1.DaemonSet
	if err := Decode("agent/daemonset.yaml", "DaemonSet", &ds); err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || spec.DNSPolicy != "ClusterFirstWithHostNet" {
		t.Errorf("hostNetwork %v, dnsPolicy %q; want true, ClusterFirstWithHostNet", spec.HostNetwork, spec.DNSPolicy)
	}
	agent, err := Container(spec, "agent")
	if err != nil {
		t.Fatal(err)
	}
	envoy, err := Container(spec, "envoy")
	if err != nil {
		t.Fatal(err)
	}
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	for _, c := range []struct {
		container  string
		mountPath  string
		hostPath   string
		propagated bool
	}{
		{"agent", "/var/run/netns", "/var/run/netns", true},
		{"agent", "/var/run/aether", "/var/run/aether", false},
		{"agent", "/var/lib/aether", "/var/lib/aether", false},
		{"agent", "/host/etc/cni/net.d", "/etc/cni/net.d", false},
		{"agent", "/host/opt/cni/bin", "/opt/cni/bin", false},
		{"envoy", "/var/run/netns", "/var/run/netns", true},
		{"envoy", "/var/run/aether", "/var/run/aether", false},
		{"envoy", "/var/lib/aether", "/var/lib/aether", false},
	} {
		ctr := agent
		if c.container == "envoy" {
			ctr = envoy
		}
		v, m, rel, err := MountedFrom(spec, ctr, c.mountPath)
		if err != nil || rel != "" {
			t.Errorf("%s: %s: %v (relative %q)", c.container, c.mountPath, err, rel)
			continue
		}
		if v.HostPath == nil || v.HostPath.Path != c.hostPath {
			t.Errorf("%s: %s comes from volume %s (%v), want hostPath %s", c.container, c.mountPath, v.Name, v.VolumeSource, c.hostPath)
		}
		if got := m.MountPropagation != nil && *m.MountPropagation != "None"; got != c.propagated {
			t.Errorf("%s: %s mount propagation %v, want propagated=%v", c.container, c.mountPath, m.MountPropagation, c.propagated)
		}
	}
	caps := func(c string, want ...string) {
		ctr, _ := Container(spec, c)
		var got []string
		if ctr.SecurityContext != nil && ctr.SecurityContext.Capabilities != nil {
			for _, a := range ctr.SecurityContext.Capabilities.Add {
				got = append(got, string(a))
			}
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("%s: capabilities %v lack %s", c, got, w)
			}
		}
	}
	caps("agent", "NET_ADMIN", "SYS_ADMIN")
	caps("envoy", "SYS_ADMIN", "NET_ADMIN") // NET_ADMIN: SO_MARK on the pods' passthrough sockets
	fields := map[string]string{}
	for _, e := range agent.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			fields[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if fields["NODE_NAME"] != "spec.nodeName" || fields["HOST_IP"] != "status.hostIP" || fields["HOST_IPS"] != "status.hostIPs" {
		t.Errorf("downward API env %v; want NODE_NAME=spec.nodeName, HOST_IP=status.hostIP, HOST_IPS=status.hostIPs", fields)
	}
	if agent.ReadinessProbe == nil || agent.ReadinessProbe.HTTPGet == nil || agent.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("agent readiness probe %+v, want GET /readyz", agent.ReadinessProbe)
	}
}
