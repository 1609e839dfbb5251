package clusterid

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/aethermesh/aether/internal/testenv"
)

// Against a real kube-apiserver: the ID is the kube-system Namespace's UID, the same on every
// read; a caller without get on namespaces is told so at once, naming the Namespace.
func TestGetFromRealAPIServer(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(api.Config)
	id, err := Get(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cs.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	if err != nil || string(ns.UID) != id || id == "" {
		t.Fatalf("Get = %q; kube-system UID %q, %v", id, ns.UID, err)
	}
	if again, err := Get(ctx, cs); err != nil || again != id {
		t.Fatalf("second Get = %q, %v; want %q", again, err, id)
	}

	// Impersonate a user without RBAC: Forbidden at once, not a retry until the deadline.
	nobody := rest.CopyConfig(api.Config)
	nobody.Impersonate = rest.ImpersonationConfig{UserName: "nobody"}
	short, cancel2 := context.WithTimeout(ctx, 30*time.Second)
	defer cancel2()
	_, err = Get(short, kubernetes.NewForConfigOrDie(nobody))
	if err == nil || short.Err() != nil || !strings.Contains(err.Error(), "Namespace kube-system") || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("Get as a user without RBAC: %v (deadline passed: %v); want forbidden at once, naming kube-system", err, short.Err())
	}
}
