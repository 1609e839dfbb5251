package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// TestRouteSourceFollowsCRDs runs a RouteSource against a real kube-apiserver that has no Gateway
// API CRDs at first: it starts without routes, watches HTTPRoutes once their CRD is installed and
// GRPCRoutes once theirs is, and its Fill follows creates and deletes.
func TestRouteSourceFollowsCRDs(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	cs := kubernetes.NewForConfigOrDie(api.Config)
	gw := gwclient.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	var changes atomic.Int32
	rs := NewRouteSource(slog.New(slog.DiscardHandler), gw, cs.Discovery(), func() { changes.Add(1) })
	rs.recheck = 200 * time.Millisecond
	if err := rs.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	fill := func() model.Sources {
		var s model.Sources
		if err := rs.Fill(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if s := fill(); s.HTTPRoutes != nil || s.GRPCRoutes != nil {
		t.Fatalf("routes without CRDs: %v %v", s.HTTPRoutes, s.GRPCRoutes)
	}

	testenv.InstallCRDs(t, api.Config, testenv.CRDSubset(t, "gateway.networking.k8s.io_httproutes.yaml"))
	if _, err := gw.GatewayV1().HTTPRoutes("shop").Create(ctx, &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "canary"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the HTTPRoute in the model's sources", func() error {
		if s := fill(); len(s.HTTPRoutes) != 1 || s.HTTPRoutes[0].Name != "canary" {
			return fmt.Errorf("HTTPRoutes = %v", s.HTTPRoutes)
		}
		return nil
	})
	if s := fill(); s.GRPCRoutes != nil {
		t.Errorf("GRPCRoutes without their CRD: %v", s.GRPCRoutes)
	}

	testenv.InstallCRDs(t, api.Config, testenv.CRDSubset(t, "gateway.networking.k8s.io_grpcroutes.yaml"))
	if _, err := gw.GatewayV1().GRPCRoutes("shop").Create(ctx, &gwv1.GRPCRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "rpc"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the GRPCRoute in the model's sources", func() error {
		if s := fill(); len(s.GRPCRoutes) != 1 {
			return fmt.Errorf("GRPCRoutes = %v", s.GRPCRoutes)
		}
		return nil
	})
	before := changes.Load()
	if err := gw.GatewayV1().HTTPRoutes("shop").Delete(ctx, "canary", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the deleted HTTPRoute gone", func() error {
		if s := fill(); len(s.HTTPRoutes) != 0 {
			return fmt.Errorf("HTTPRoutes = %v", s.HTTPRoutes)
		}
		if changes.Load() == before {
			return fmt.Errorf("no change reported")
		}
		return nil
	})
}
