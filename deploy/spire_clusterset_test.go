package deploy

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"text/template"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/aethermesh/aether/model"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// betaBundle is a SPIFFE bundle as `spire-server bundle show -format spiffe` prints it (the
// chart checks its shape only; the Controller Manager parses it).
const betaBundle = `{"keys":[{"use":"x509-svid","kty":"EC","crv":"P-256","x":"AA","y":"AA","x5c":["AA=="]}],"spiffe_refresh_hint":300}`

// TestChartSPIRESharedTrustDomain renders spire.clusterset.mode sharedTrustDomain: the SPIRE
// server's CA is signed by the upstream authority of the Secret the value names (UpstreamAuthority
// disk, its files where the Secret is mounted), which the spire-server container alone mounts
// (not the Controller Manager beside it, not the SPIRE or aether agents); with intermediate the
// roots of upstream-roots.crt are the bundle; SPIRE accepts both configurations; no federation is rendered.
func TestChartSPIRESharedTrustDomain(t *testing.T) {
	for _, intermediate := range []bool{false, true} {
		args := []string{"--set", "cluster=alpha", "--set", "spire.clusterset.mode=sharedTrustDomain",
			"--set", "spire.clusterset.upstreamAuthority.secretName=mesh-root"}
		if intermediate {
			args = append(args, "--set", "spire.clusterset.upstreamAuthority.intermediate=true")
		}
		r := renderSPIRE(t, "aether-system", "spire", "", args...)
		r.validate(t)
		ua, _ := at(r.server, "plugins", "UpstreamAuthority", "disk", "plugin_data").(map[string]any)
		files := []string{"cert_file_path", "key_file_path"}
		keys := []string{"upstream-ca.crt", "upstream-ca.key"}
		if intermediate {
			files, keys = append(files, "bundle_file_path"), append(keys, "upstream-roots.crt")
		}
		if len(ua) != len(files) {
			t.Errorf("intermediate %v: UpstreamAuthority disk %v, want %v", intermediate, ua, files)
		}
		spec := r.statefulSet.Spec.Template.Spec
		for i, f := range files {
			p, _ := ua[f].(string)
			v, m, key, err := MountedFrom(spec, r.serverC, p)
			if err != nil || v.Secret == nil || v.Secret.SecretName != "mesh-root" || key != keys[i] || !m.ReadOnly ||
				v.Secret.DefaultMode == nil || *v.Secret.DefaultMode != 0o400 {
				t.Errorf("intermediate %v: %s %q: volume %+v mount %+v key %q (%v); want key %s of the Secret mesh-root, read-only, 0400",
					intermediate, f, p, v, m, key, err, keys[i])
			}
			for _, c := range []corev1.Container{r.cmC, r.agentC} {
				if _, _, _, err := MountedFrom(spec, c, p); err == nil {
					t.Errorf("container %s mounts the upstream authority's %s", c.Name, keys[i])
				}
			}
		}
		for _, o := range r.objs {
			b, _ := o.MarshalJSON()
			if o.GetKind() != "StatefulSet" && strings.Contains(string(b), "mesh-root") {
				t.Errorf("%s %s names the upstream authority's Secret mesh-root: only the SPIRE server may mount it", o.GetKind(), o.GetName())
			}
			if o.GetKind() == "ClusterFederatedTrustDomain" || o.GetName() == "spire-server-bundle-endpoint" {
				t.Errorf("sharedTrustDomain renders %s %s", o.GetKind(), o.GetName())
			}
		}
		if at(r.server, "server", "federation") != nil {
			t.Errorf("sharedTrustDomain: server.conf has a federation section %v", at(r.server, "server", "federation"))
		}
	}
	// Without the value, no upstream authority: the server's own self-signed CA.
	if r := renderSPIRE(t, "aether-system", "spire", "", "--set", "cluster=alpha"); at(r.server, "plugins", "UpstreamAuthority") != nil {
		t.Errorf("the default renders an UpstreamAuthority: %v", at(r.server, "plugins", "UpstreamAuthority"))
	}
}

// TestChartSPIREFederation renders spire.clusterset.mode federation for alpha, federated with
// beta: the SPIRE server serves its bundle endpoint (https_spiffe) on the port of the value, the
// Service spire-server-bundle-endpoint (NodePort, the given node port) reaches that container
// port; beta is a ClusterFederatedTrustDomain of the Controller Manager's class with its bundle
// endpoint, its server's SPIFFE ID (the default spiffe://<td>/spire/server) and its bootstrap
// bundle; every ClusterSPIFFEID of the chart federates with beta; the aether agents admit beta's
// workloads (AETHER_CLUSTERSET_TRUST_DOMAINS); SPIRE accepts the configuration.
func TestChartSPIREFederation(t *testing.T) {
	const beta = "beta.example.org"
	betaCFTD := "beta-example-org-" + fmt.Sprintf("%x", sha256.Sum256([]byte(beta)))[:8] // unique per trust domain
	base := []string{"--set", "cluster=alpha", "--set", "trustDomain=alpha.example.org", "--set", "spire.clusterset.mode=federation",
		"--set", "spire.clusterset.bundleEndpoint.port=9443", "--set", "spire.clusterset.bundleEndpoint.service.nodePort=31443"}
	r := renderSPIRE(t, "aether-system", "spire", "", append(base, federatesWith(t, map[string]string{
		"trustDomain": beta, "bundleEndpointURL": "https://192.0.2.10:31443", "trustDomainBundle": betaBundle})...)...)
	r.validate(t)
	if got, want := at(r.server, "server", "federation"), map[string]any{"bundle_endpoint": map[string]any{
		"address": "0.0.0.0", "port": float64(9443), "profile": map[string]any{"https_spiffe": map[string]any{}}}}; !reflect.DeepEqual(got, want) {
		t.Errorf("server.conf federation %v, want %v", got, want)
	}
	if at(r.server, "plugins", "UpstreamAuthority") != nil {
		t.Error("federation renders an UpstreamAuthority")
	}
	var svc corev1.Service
	object(t, r.objs, "Service", "spire-server-bundle-endpoint", &svc)
	port := -1
	for _, p := range r.serverC.Ports {
		if p.Name == "bundle-endpoint" {
			port = int(p.ContainerPort)
		}
	}
	if svc.Namespace != "spire" || svc.Spec.Type != corev1.ServiceTypeNodePort || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9443 ||
		svc.Spec.Ports[0].NodePort != 31443 || svc.Spec.Ports[0].TargetPort != intstr.FromString("bundle-endpoint") || port != 9443 ||
		!labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(r.statefulSet.Spec.Template.Labels)) {
		t.Errorf("Service spire-server-bundle-endpoint %+v (container port %d); want NodePort 31443 to the server's bundle endpoint 9443", svc.Spec, port)
	}

	var cftd struct {
		Spec struct {
			ClassName             string `json:"className"`
			TrustDomain           string `json:"trustDomain"`
			BundleEndpointURL     string `json:"bundleEndpointURL"`
			BundleEndpointProfile struct {
				Type             string `json:"type"`
				EndpointSPIFFEID string `json:"endpointSPIFFEID"`
			} `json:"bundleEndpointProfile"`
			TrustDomainBundle string `json:"trustDomainBundle"`
		} `json:"spec"`
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
	}
	object(t, r.objs, "ClusterFederatedTrustDomain", betaCFTD, &cftd)
	if s := cftd.Spec; s.ClassName != "aether" || s.TrustDomain != beta || s.BundleEndpointURL != "https://192.0.2.10:31443" ||
		s.BundleEndpointProfile.Type != "https_spiffe" || s.BundleEndpointProfile.EndpointSPIFFEID != "spiffe://"+beta+"/spire/server" ||
		s.TrustDomainBundle != betaBundle {
		t.Errorf("ClusterFederatedTrustDomain %s: %+v", betaCFTD, s)
	}
	for _, name := range []string{"aether-workloads", "aether-agent", "aether-edge"} {
		var fw []string
		for _, o := range r.objs {
			if o.GetKind() == "ClusterSPIFFEID" && o.GetName() == name {
				fw, _, _ = unstructured.NestedStringSlice(o.Object, "spec", "federatesWith")
			}
		}
		if !slices.Equal(fw, []string{beta}) {
			t.Errorf("ClusterSPIFFEID %s federatesWith %v, want [%s]", name, fw, beta)
		}
	}
	var cfg corev1.ConfigMap
	object(t, r.objs, "ConfigMap", "aether-config", &cfg)
	if got := cfg.Data["AETHER_CLUSTERSET_TRUST_DOMAINS"]; got != beta {
		t.Errorf("aether-config AETHER_CLUSTERSET_TRUST_DOMAINS %q, want %q", got, beta)
	}

	// Before the bundles are exchanged (the first install): the endpoint, nothing federated yet.
	first := renderSPIRE(t, "aether-system", "spire", "", base...)
	var firstCfg corev1.ConfigMap
	object(t, first.objs, "ConfigMap", "aether-config", &firstCfg)
	if !hasObject(first.objs, "Service", "spire-server-bundle-endpoint") || at(first.server, "server", "federation") == nil {
		t.Error("federation without federatesWith: no bundle endpoint")
	}
	if _, ok := firstCfg.Data["AETHER_CLUSTERSET_TRUST_DOMAINS"]; ok || hasObject(first.objs, "ClusterFederatedTrustDomain", betaCFTD) {
		t.Errorf("federation without federatesWith: AETHER_CLUSTERSET_TRUST_DOMAINS %q or a ClusterFederatedTrustDomain rendered", firstCfg.Data["AETHER_CLUSTERSET_TRUST_DOMAINS"])
	}
	// The upgrade that federates rolls the aether agents (their settings changed), never SPIRE:
	// a SPIRE server restarted on an emptyDir makes a new CA, and the bundle the other clusters
	// were given would be stale.
	const checksum = "checksum/config"
	if a, b := first.statefulSet.Spec.Template.Annotations[checksum], r.statefulSet.Spec.Template.Annotations[checksum]; a == "" || a != b {
		t.Errorf("spire-server %s %q before federatesWith, %q after: the upgrade would restart the SPIRE server", checksum, a, b)
	}
	if a, b := first.daemonSet.Spec.Template.Annotations[checksum], r.daemonSet.Spec.Template.Annotations[checksum]; a != b {
		t.Errorf("spire-agent %s %q before federatesWith, %q after: the upgrade would restart the SPIRE agents", checksum, a, b)
	}
	var agentBefore, agentAfter appsv1.DaemonSet
	object(t, first.objs, "DaemonSet", "aether-agent", &agentBefore)
	object(t, r.objs, "DaemonSet", "aether-agent", &agentAfter)
	if a, b := agentBefore.Spec.Template.Annotations[checksum], agentAfter.Spec.Template.Annotations[checksum]; a == b {
		t.Errorf("aether-agent %s unchanged by federatesWith (%q): the agents would not read AETHER_CLUSTERSET_TRUST_DOMAINS", checksum, a)
	}
}

// TestChartRefusesBadClusterset checks that helm template refuses each bad spire.clusterset value
// with an error naming it.
func TestChartRefusesBadClusterset(t *testing.T) {
	fed := func(tdURLBundle ...string) []string {
		var fw []map[string]string
		for i := 0; i+2 < len(tdURLBundle); i += 3 {
			fw = append(fw, map[string]string{"trustDomain": tdURLBundle[i], "bundleEndpointURL": tdURLBundle[i+1], "trustDomainBundle": tdURLBundle[i+2]})
		}
		return federatesWith(t, fw...)
	}
	federation := []string{"--set", "spire.clusterset.mode=federation", "--set", "trustDomain=alpha.example.org"}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"mode", []string{"--set", "spire.clusterset.mode=mesh"}, []string{"/spire/clusterset/mode", "mesh"}},
		{"mode with the development CA", []string{"--set", "identity.mode=dev-ca", "--set", "spire.clusterset.mode=federation"},
			[]string{"spire.clusterset.mode \"federation\"", "identity.mode spire"}},
		{"federatesWith without federation", append([]string{"--set", "spire.clusterset.mode=sharedTrustDomain"}, fed("beta.example.org", "https://b:8443", betaBundle)...),
			[]string{"spire.clusterset.federatesWith", "mode \"sharedTrustDomain\""}},
		{"federating with itself", append(federation, fed("alpha.example.org", "https://b:8443", betaBundle)...),
			[]string{"spire.clusterset.federatesWith[0].trustDomain", "alpha.example.org"}},
		{"a trust domain twice", append(federation, fed("beta.example.org", "https://b:8443", betaBundle, "beta.example.org", "https://c:8443", betaBundle)...),
			[]string{"spire.clusterset.federatesWith[1].trustDomain", "twice"}},
		{"bundle not JSON", append(federation, fed("beta.example.org", "https://b:8443", "-----BEGIN CERTIFICATE-----")...),
			[]string{"spire.clusterset.federatesWith[0].trustDomainBundle", "SPIFFE bundle"}},
		{"endpoint not https", append(federation, fed("beta.example.org", "http://b:8443", betaBundle)...),
			[]string{"/spire/clusterset/federatesWith/0/bundleEndpointURL"}},
		{"trust domain not one", append(federation, fed("Beta Org", "https://b:8443", betaBundle)...),
			[]string{"/spire/clusterset/federatesWith/0/trustDomain"}},
		{"no bundle", append(federation, "--set", "spire.clusterset.federatesWith[0].trustDomain=beta.example.org",
			"--set", "spire.clusterset.federatesWith[0].bundleEndpointURL=https://b:8443"),
			[]string{"/spire/clusterset/federatesWith/0", "trustDomainBundle"}},
		{"service type", []string{"--set", "spire.clusterset.bundleEndpoint.service.type=ExternalName"}, []string{"/spire/clusterset/bundleEndpoint/service/type"}},
		{"bundle without an X.509 authority", append(federation, fed("beta.example.org", "https://b:8443", `{"keys":[]}`)...),
			[]string{"spire.clusterset.federatesWith[0].trustDomainBundle", "X.509"}},
		{"federatesWith with the development CA", append([]string{"--set", "identity.mode=dev-ca"}, fed("beta.example.org", "https://b:8443", betaBundle)...),
			[]string{"spire.clusterset.federatesWith", "mode \"\""}},
		{"port of the server's API", append(federation, "--set", "spire.clusterset.bundleEndpoint.port=8081"), []string{"spire.clusterset.bundleEndpoint.port 8081"}},
		{"node port with ClusterIP", []string{"--set", "spire.clusterset.bundleEndpoint.service.type=ClusterIP", "--set", "spire.clusterset.bundleEndpoint.service.nodePort=31443"},
			[]string{"spire.clusterset.bundleEndpoint.service.nodePort", "ClusterIP"}},
		{"port", []string{"--set", "spire.clusterset.bundleEndpoint.port=0"}, []string{"/spire/clusterset/bundleEndpoint/port"}},
		{"upstream Secret name", []string{"--set", "spire.clusterset.upstreamAuthority.secretName=Root_CA"}, []string{"/spire/clusterset/upstreamAuthority/secretName"}},
		{"extraConfig of the clusterset trust domains", []string{"--set", "extraConfig.AETHER_CLUSTERSET_TRUST_DOMAINS=beta"},
			[]string{"extraConfig.AETHER_CLUSTERSET_TRUST_DOMAINS", "spire.clusterset.federatesWith"}},
	} {
		t.Run(c.name, func(t *testing.T) { wantRefused(t, c.args, c.want...) })
	}
}

// federatesWith returns the helm arguments setting spire.clusterset.federatesWith to entries
// (--set-json: a bundle's JSON would not survive --set's syntax).
func federatesWith(t *testing.T, entries ...map[string]string) []string {
	t.Helper()
	b, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	return []string{"--set-json", "spire.clusterset.federatesWith=" + string(b)}
}

// TestChartSPIREEdgeEntry: the ClusterSPIFFEID aether-edge selects the registrar's edge pods by
// their labels and requires, through its workload selector template rendered as the Controller
// Manager renders it, the ServiceAccount the registrar gives the Gateway's pods
// (model.EdgeServiceAccountName): a pod that copies the labels under another ServiceAccount gets
// no entry the aether agent's selectors (identity/spire.PodSelectors) match.
func TestChartSPIREEdgeEntry(t *testing.T) {
	r := renderSPIRE(t, "aether-system", "spire", "", "--set", "cluster=alpha")
	var tmpls []string
	var sel map[string]any
	for _, o := range r.objs {
		if o.GetKind() == "ClusterSPIFFEID" && o.GetName() == "aether-edge" {
			tmpls, _, _ = unstructured.NestedStringSlice(o.Object, "spec", "workloadSelectorTemplates")
			sel, _, _ = unstructured.NestedMap(o.Object, "spec", "podSelector")
		}
	}
	if len(tmpls) != 1 {
		t.Fatalf("aether-edge workloadSelectorTemplates %q, want one", tmpls)
	}
	tp, err := template.New("sel").Option("missingkey=error").Parse(tmpls[0])
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	labels := map[string]string{"aether.io/managed-by": "aether", "gateway.networking.k8s.io/gateway-name": "web"}
	if err := tp.Execute(&b, map[string]any{"PodMeta": &metav1.ObjectMeta{Namespace: "edge", Labels: labels}, "PodSpec": &corev1.PodSpec{}}); err != nil {
		t.Fatal(err)
	}
	if want := "k8s:sa:" + model.EdgeServiceAccountName("web"); b.String() != want {
		t.Errorf("aether-edge's workload selector for Gateway web's pod: %q, want %q", b.String(), want)
	}
	if want := map[string]any{"matchLabels": map[string]any{"aether.io/managed-by": "aether"},
		"matchExpressions": []any{map[string]any{"key": "gateway.networking.k8s.io/gateway-name", "operator": "Exists"}}}; !reflect.DeepEqual(sel, want) {
		t.Errorf("aether-edge podSelector %v, want %v", sel, want)
	}
}
