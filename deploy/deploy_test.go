package deploy

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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
	if len(res) < 2 || res[0] != "namespace.yaml" || res[1] != "spire/namespace.yaml" {
		t.Errorf("kustomization.yaml starts with %v, want namespace.yaml and spire/namespace.yaml", res[:min(2, len(res))])
	}
	// A custom resource after its CRD: kubectl apply -k maps every object first, and the CRDs
	// must be applied before (docs/deploy.md), but the order still says what depends on what.
	if slices.Index(res, "spire/clusterspiffeids.yaml") < slices.Index(res, "crds/spire.spiffe.io_clusterspiffeids.yaml") {
		t.Errorf("kustomization.yaml lists spire/clusterspiffeids.yaml before its CRD")
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
	apply := newApplier(t, api).apply
	for _, f := range []string{"namespace.yaml", "spire/namespace.yaml"} {
		ns, err := Objects(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range ns {
			if err := apply(o, false); err != nil {
				t.Fatalf("create namespace %s: %v", o.GetName(), err)
			}
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
	for _, k := range []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "DaemonSet", "Deployment", "ConfigMap",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "StatefulSet", "Service", "ClusterSPIFFEID"} {
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

// TestWorkloadSecurity checks every container of deploy/'s workloads against the hardening
// docs/deploy.md describes, which a dry run accepts either way: seccomp RuntimeDefault, a
// read-only root filesystem, all capabilities dropped but exactly the ones the container needs,
// no privileged mode, no_new_privs (allowPrivilegeEscalation: false) wherever CAP_SYS_ADMIN does
// not make it meaningless, an explicit user, and the ServiceAccount token only where a process
// calls the API (not in Envoy's container, nor in the uninstall DaemonSet). The node's PID
// namespace only for the SPIRE agent, whose k8s workload attestor needs its callers' PIDs.
func TestWorkloadSecurity(t *testing.T) {
	type want struct {
		caps  []string
		uid   int64
		token bool
	}
	for _, w := range []struct {
		file, kind string
		hostPID    bool
		containers map[string]want
	}{
		{"agent/daemonset.yaml", "DaemonSet", false, map[string]want{
			"agent": {caps: []string{"NET_ADMIN", "SYS_ADMIN", "NET_RAW"}, uid: 0, token: true},
			"envoy": {caps: []string{"SYS_ADMIN", "NET_ADMIN"}, uid: 0},
		}},
		{"registrar/deployment.yaml", "Deployment", false, map[string]want{
			"registrar": {uid: 65532, token: true},
		}},
		{"uninstall/cni-uninstall.yaml", "DaemonSet", false, map[string]want{
			"uninstall-cni": {caps: []string{"NET_ADMIN"}, uid: 0},
			"done":          {uid: 65534},
		}},
		{"spire/server.yaml", "StatefulSet", false, map[string]want{
			"spire-server":       {uid: 65532, token: true},
			"controller-manager": {uid: 65532, token: true},
		}},
		// Root for the admin socket's directory (the aether agent's uid), but no capability.
		{"spire/agent.yaml", "DaemonSet", true, map[string]want{
			"spire-agent": {uid: 0, token: true},
		}},
	} {
		var spec corev1.PodSpec
		switch w.kind {
		case "DaemonSet":
			var ds appsv1.DaemonSet
			if err := Decode(w.file, w.kind, &ds); err != nil {
				t.Fatal(err)
			}
			spec = ds.Spec.Template.Spec
		case "Deployment":
			var d appsv1.Deployment
			if err := Decode(w.file, w.kind, &d); err != nil {
				t.Fatal(err)
			}
			spec = d.Spec.Template.Spec
		case "StatefulSet":
			var st appsv1.StatefulSet
			if err := Decode(w.file, w.kind, &st); err != nil {
				t.Fatal(err)
			}
			spec = st.Spec.Template.Spec
		}
		psc := spec.SecurityContext
		if psc == nil {
			psc = &corev1.PodSecurityContext{}
		}
		if spec.HostPID != w.hostPID || spec.HostIPC {
			t.Errorf("%s: hostPID %v, hostIPC %v; want hostPID %v, no hostIPC", w.file, spec.HostPID, spec.HostIPC, w.hostPID)
		}
		automount := spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken
		if n := len(spec.InitContainers) + len(spec.Containers); n != len(w.containers) {
			t.Errorf("%s: %d containers, the test knows %d: add the new one here", w.file, n, len(w.containers))
		}
		for name, want := range w.containers {
			c, err := Container(spec, name)
			if err != nil {
				t.Errorf("%s: %v", w.file, err)
				continue
			}
			where := w.file + ": container " + name
			sc := c.SecurityContext
			if sc == nil {
				t.Errorf("%s: no securityContext", where)
				continue
			}
			seccomp := psc.SeccompProfile
			if sc.SeccompProfile != nil {
				seccomp = sc.SeccompProfile
			}
			if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s: seccomp profile %v, want RuntimeDefault", where, seccomp)
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s: root filesystem not read-only", where)
			}
			if sc.Privileged != nil && *sc.Privileged {
				t.Errorf("%s: privileged", where)
			}
			var drop, add []string
			if sc.Capabilities != nil {
				for _, d := range sc.Capabilities.Drop {
					drop = append(drop, string(d))
				}
				for _, a := range sc.Capabilities.Add {
					add = append(add, strings.TrimPrefix(string(a), "CAP_"))
				}
			}
			if !slices.Equal(drop, []string{"ALL"}) {
				t.Errorf("%s: capabilities drop %v, want [ALL]", where, drop)
			}
			slices.Sort(add)
			wantAdd := slices.Sorted(slices.Values(want.caps))
			if !slices.Equal(add, wantAdd) {
				t.Errorf("%s: capabilities add %v, want exactly %v", where, add, wantAdd)
			}
			ape := sc.AllowPrivilegeEscalation
			if slices.Contains(want.caps, "SYS_ADMIN") {
				// no_new_privs is no boundary for CAP_SYS_ADMIN, and the API refuses the pair
				// when the capability is spelled CAP_SYS_ADMIN: setting it would only look safer.
				if ape != nil && !*ape {
					t.Errorf("%s: allowPrivilegeEscalation false with SYS_ADMIN (docs/deploy.md#hardening)", where)
				}
			} else if ape == nil || *ape {
				t.Errorf("%s: allowPrivilegeEscalation %v, want false", where, ape)
			}
			uid := psc.RunAsUser
			if sc.RunAsUser != nil {
				uid = sc.RunAsUser
			}
			if uid == nil || *uid != want.uid {
				t.Errorf("%s: runAsUser %v, want %d set explicitly", where, uid, want.uid)
			}
			nonRoot := psc.RunAsNonRoot
			if sc.RunAsNonRoot != nil {
				nonRoot = sc.RunAsNonRoot
			}
			if want.uid != 0 && (nonRoot == nil || !*nonRoot) {
				t.Errorf("%s: runAsNonRoot %v, want true", where, nonRoot)
			}
			v, _, _, err := MountedFrom(spec, c, "/var/run/secrets/kubernetes.io/serviceaccount/token")
			token := err == nil && v.Projected != nil && slices.ContainsFunc(v.Projected.Sources, func(s corev1.VolumeProjection) bool { return s.ServiceAccountToken != nil })
			if got := token || automount; got != want.token {
				t.Errorf("%s: ServiceAccount token mounted %v (automount %v), want %v", where, got, automount, want.token)
			}
		}
	}
}

// applier applies objects to a real kube-apiserver as kubectl apply --server-side does, with
// strict field validation (an unknown or misspelt field fails).
type applier struct {
	ctx    context.Context
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// newApplier returns an applier for api whose requests end with the test (or after 3 minutes).
func newApplier(t *testing.T, api *testenv.KubeAPIServer) *applier {
	t.Helper()
	dyn, err := dynamic.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return &applier{ctx: ctx, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

// apply server-side applies u, as a dry run (dryRun) or for real.
func (a *applier) apply(u *unstructured.Unstructured, dryRun bool) error {
	gvk := u.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
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
	r := a.dyn.Resource(m.Resource)
	if u.GetNamespace() != "" {
		_, err = r.Namespace(u.GetNamespace()).Patch(a.ctx, u.GetName(), types.ApplyPatchType, b, opts)
	} else {
		_, err = r.Patch(a.ctx, u.GetName(), types.ApplyPatchType, b, opts)
	}
	return err
}
