//go:build linux

package agent

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/registry"
)

// TestPrivilegedConfigImportTraffic observes an imported projection on real traffic: the real
// agent (--import-config) in its node namespace, its Envoy and a captured client pod. Cluster
// beta exports shop/pay and projects a producer HTTPRoute that redirects requests with header
// x-canary: beta to beta.example; the client's request to pay's clusterset VIP (the
// ServiceImport) with that header gets the redirect, one without it does not, and once beta
// deletes the projection the header changes nothing.
func TestPrivilegedConfigImportTraffic(t *testing.T) {
	testenv.RequireRoot(t)
	m := startGAMMAMeshWith(t, "--import-config")
	ctx := m.ctx
	const vip = "10.96.77.7"
	mcs := mcsclient.NewForConfigOrDie(m.api.Config)
	if _, err := mcs.MulticlusterV1beta1().ServiceImports("shop").Create(ctx, &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Name: "pay"},
		Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{vip},
			Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	client := m.addPod(t, podSpec{namespace: "shop", name: "client-1", labels: map[string]string{"app": "client"}, port: 8080})
	beta, err := registry.New(registry.Config{Endpoints: m.etcd.Endpoints, Region: "eu", Cluster: "beta", Logger: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer beta.Close()
	created := time.Now().Add(-time.Hour)
	if err := beta.Export(ctx, &registryv1.ExportMark{Service: &registryv1.ServiceRef{Namespace: "shop", Name: "pay"},
		Ports:      []*registryv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
		CreateTime: created.UTC().Format(time.RFC3339Nano)}); err != nil {
		t.Fatal(err)
	}
	p := testProjection("shop", "pay", 1, "beta", created)
	rule := p.Routes[0].Rules[0]
	rule.Backends = nil
	rule.Filters = []*registryv1.RouteFilter{{Filter: &registryv1.RouteFilter_RequestRedirect{RequestRedirect: &registryv1.RequestRedirect{
		Hostname: "beta.example", StatusCode: http.StatusFound}}}}
	if err := beta.PutConfig(ctx, p); err != nil {
		t.Fatal(err)
	}

	c := httpClient(client, false)
	redirected := func(hdr map[string]string) (bool, error) {
		a, err := do(ctx, c, http.MethodGet, "http://"+vip+"/pay", hdr)
		if err != nil {
			return false, err
		}
		return a.status == http.StatusFound && a.header.Get("Location") == "http://beta.example/pay", nil
	}
	testenv.Eventually(t, 60*time.Second, "the imported redirect", func() error {
		if ok, err := redirected(map[string]string{"x-canary": "beta"}); !ok {
			return fmt.Errorf("GET %s/pay with x-canary: beta not redirected to beta.example (%v)", vip, err)
		}
		return nil
	})
	if ok, err := redirected(nil); ok || err != nil {
		t.Errorf("GET %s/pay without the header: redirected %v (%v), want the default route", vip, ok, err)
	}
	if err := beta.DeleteConfig(ctx, "shop", "pay"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the redirect gone with the projection", func() error {
		if ok, err := redirected(map[string]string{"x-canary": "beta"}); ok || err != nil {
			return fmt.Errorf("still redirected (%v)", err)
		}
		return nil
	})
}
