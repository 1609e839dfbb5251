package scenarios

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aethermesh/aether/internal/testenv"
)

// udpCanaryPort is the UDP port of Services canary, canary-v1 and canary-v2 in B (to the echo
// pods' substrate.EchoUDPPort).
const udpCanaryPort = 53

// udp sends msg in one datagram from B's client pod to addr and returns the echo's reply.
func (w *world) udp(ctx context.Context, addr, msg string) (reply, error) {
	return w.clientReply(ctx, w.b, "udp", addr, msg)
}

// meshUDPRoute: in B, UDPRoute canary-udp on Service canary's UDP port sends every datagram to
// canary-v2. B's registrar accepts it; B's client (a meshed pod on node 1), sending datagrams to
// canary's VIP, is answered by canary-v2 only (kube-proxy would spread them over canary-v1 and
// canary-v2), each from the VIP: its capture DNATs them to its node Envoy's UDP listener on the
// node address, which relays them to canary-v2's pod on node 2. With the route deleted, the
// datagrams go to the Service again (kube-proxy: canary-v1 answers too).
func (w *world) meshUDPRoute(t *testing.T) {
	ctx := context.Background()
	routes := w.p.Gateway(w.b).GatewayV1().UDPRoutes(ns)
	backend := gwv1.BackendRef{Weight: ptrTo(int32(1)), BackendObjectReference: gwv1.BackendObjectReference{
		Group: ptrTo(gwv1.Group("")), Kind: ptrTo(gwv1.Kind("Service")), Name: "canary-v2", Port: ptrTo(gwv1.PortNumber(udpCanaryPort))}}
	route := &gwv1.UDPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "canary-udp"}, Spec: gwv1.UDPRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{serviceParent(ns, "canary", udpCanaryPort)}},
		Rules:           []gwv1.UDPRouteRule{{BackendRefs: []gwv1.BackendRef{backend}}},
	}}
	if _, err := routes.Create(ctx, route, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = routes.Delete(context.Background(), route.Name, metav1.DeleteOptions{})
		}
	})
	testenv.Eventually(t, 90*time.Second, "UDPRoute "+ns+"/canary-udp in "+w.b+" Accepted", func() error {
		r, err := routes.Get(ctx, route.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, ps := range r.Status.Parents {
			if ps.ControllerName != gatewayController {
				continue
			}
			if c := meta.FindStatusCondition(ps.Conditions, string(gwv1.RouteConditionAccepted)); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != r.Generation {
				return fmt.Errorf("Accepted = %+v", c)
			}
			return nil
		}
		return fmt.Errorf("no status entry of %s in %+v", gatewayController, r.Status.Parents)
	})
	addr := net.JoinHostPort(w.clusterIP(t, w.b, "canary"), strconv.Itoa(udpCanaryPort))
	ask := func(i int) (reply, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return w.udp(ctx, addr, fmt.Sprint("datagram ", i))
	}
	// The redirect follows the route's status by a model build, an Envoy ACK and the pods'
	// capture rules. Until then kube-proxy answers from either pod: one canary-v2 answer can be
	// luck, eight in a row are not (1 in 256).
	testenv.Eventually(t, 90*time.Second, "datagrams to "+addr+" answered by canary-v2", func() error {
		for i := range 8 {
			r, err := ask(-1)
			if err != nil {
				return err
			}
			if r.Server != "canary-v2" {
				return fmt.Errorf("answer %d answered by %s", i+1, r.Server)
			}
		}
		return nil
	})
	const n = 20
	for i := range n {
		r, err := ask(i)
		if err != nil {
			t.Fatalf("datagram %d to %s: %v", i, addr, err)
		}
		if r.Server != "canary-v2" || r.Protocol != "udp" || r.Message != fmt.Sprint("datagram ", i) {
			t.Fatalf("datagram %d to %s: answer %+v, want canary-v2 echoing it", i, addr, r)
		}
	}
	t.Logf("%d datagrams to canary's VIP %s: every one answered by canary-v2", n, addr)

	if err := routes.Delete(ctx, route.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted = true
	testenv.Eventually(t, 90*time.Second, "datagrams to "+addr+" spread over the Service's pods again", func() error {
		for i := range 20 {
			if r, err := ask(100 + i); err == nil && r.Server == "canary-v1" {
				return nil
			}
		}
		return fmt.Errorf("no answer from canary-v1 in 20 datagrams")
	})
}
