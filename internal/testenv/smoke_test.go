package testenv

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const staticEnvoyBootstrap = `
admin:
  address:
    socket_address: { address: 127.0.0.1, port_value: 0 }
static_resources:
  listeners:
  - name: direct
    address:
      socket_address: { address: 127.0.0.1, port_value: 0 }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: smoke
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                direct_response: { status: 200, body: { inline_string: "smoke" } }
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`

// TestEnvoySmoke starts the real Envoy from a static bootstrap and checks its admin API reports
// the pinned version and the static listener.
func TestEnvoySmoke(t *testing.T) {
	e := StartEnvoy(t, staticEnvoyBootstrap, EnvoyOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body, err := e.Admin(ctx, "/server_info")
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Version string `json:"version"`
		State   string `json:"state"`
	}
	if err := json.Unmarshal([]byte(body), &info); err != nil {
		t.Fatalf("decode /server_info: %v", err)
	}
	tl, _ := FindTools()
	if want := "/" + tl.Versions["ENVOY_VERSION"] + "/"; !strings.Contains(info.Version, want) {
		t.Errorf("server_info version = %q, want it to contain %q", info.Version, want)
	}
	if info.State != "LIVE" {
		t.Errorf("server_info state = %q, want LIVE", info.State)
	}
	listeners, err := e.Admin(ctx, "/listeners")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(listeners, "direct::127.0.0.1:") {
		t.Errorf("/listeners = %q, want the static listener 'direct'", listeners)
	}
}

// TestKubeAPIServerSmoke starts the real kube-apiserver (with its etcd), checks /readyz and the
// pinned version, and creates a Namespace.
func TestKubeAPIServerSmoke(t *testing.T) {
	s := StartTestKubeAPIServer(t, KubeAPIServerOptions{})
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil || string(body) != "ok" {
		t.Fatalf("/readyz = %q, %v; want ok", body, err)
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	tl, _ := FindTools()
	if v.GitVersion != tl.Versions["KUBERNETES_VERSION"] {
		t.Errorf("server version = %q, want %q", v.GitVersion, tl.Versions["KUBERNETES_VERSION"])
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "smoke"}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	got, err := cs.CoreV1().Namespaces().Get(ctx, "smoke", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get namespace: %v", err)
	}
	if got.UID == "" {
		t.Errorf("namespace has no UID: %+v", got.ObjectMeta)
	}

	// An API outage keeps the data: after a restart the namespace is still there.
	s.StopAPIServer()
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "smoke", metav1.GetOptions{}); err == nil {
		t.Fatal("the API server answered while stopped")
	}
	if err := s.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := cs.CoreV1().Namespaces().Get(ctx, "smoke", metav1.GetOptions{})
	if err != nil || again.UID != got.UID {
		t.Fatalf("after restart: namespace %v, %v; want the same UID %s", again, err, got.UID)
	}
}

// TestEmbeddedEtcdSmoke puts a key into an embedded etcd and sees it through a watch.
func TestEmbeddedEtcdSmoke(t *testing.T) {
	e := StartEmbeddedEtcd(t, nil)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put, err := cli.Put(ctx, "/smoke/a", "1")
	if err != nil {
		t.Fatal(err)
	}
	// Watching from the put's revision sees it whether or not the watch was set up in time.
	wch := cli.Watch(ctx, "/smoke/", clientv3.WithPrefix(), clientv3.WithRev(put.Header.Revision))
	select {
	case resp := <-wch:
		if err := resp.Err(); err != nil {
			t.Fatal(err)
		}
		if len(resp.Events) != 1 || string(resp.Events[0].Kv.Key) != "/smoke/a" || string(resp.Events[0].Kv.Value) != "1" {
			t.Fatalf("watch events = %v, want one put of /smoke/a=1", resp.Events)
		}
	case <-ctx.Done():
		t.Fatal("no watch event within 30s")
	}
}
