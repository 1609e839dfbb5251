package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/client-go/kubernetes"

	"github.com/aethermesh/aether/internal/clusterid"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/registry"
)

// TestAgentRespectsPartitionClaim: an agent's endpoint registration (the agent's own
// endpointRegistrar and claim watch, its cluster ID read from a real kube-apiserver) against a
// real etcd whose partition of the agent's cluster name is claimed by another cluster: nothing
// is written and readiness part partition-claim fails naming the claim and the fix. After the
// partition is re-claimed for the agent's cluster the endpoint is registered and the part
// passes, without a restart; when another cluster takes the partition back, the node's
// endpoints are withdrawn.
func TestAgentRespectsPartitionClaim(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id, err := clusterid.Get(ctx, kubernetes.NewForConfigOrDie(api.Config))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	open := func(clusterID string, claimer bool) *registry.Registry {
		r, err := registry.New(registry.Config{Endpoints: etcd.Endpoints, Region: "eu", Cluster: "east", LeaseTTL: 5 * time.Second,
			Logger: log, ClusterID: clusterID, Claimer: claimer})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	other := open("uid-other", true)
	if _, err := other.EnsureClaim(ctx); err != nil {
		t.Fatal(err)
	}
	east := other.Origin()
	keys := func() ([]string, error) {
		resp, err := other.Client().Get(ctx, east.Prefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return nil, err
		}
		var out []string
		for _, kv := range resp.Kvs {
			out = append(out, string(kv.Key))
		}
		return out, nil
	}
	epKey := east.EndpointKey("shop", "web", "u1")
	wantKeys := func(want ...string) func() error {
		return func() error {
			got, err := keys()
			if err != nil {
				return err
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("partition keys %v, want %v", got, want)
			}
			return nil
		}
	}

	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	m := model.New(1, "east", "", "", model.Node{Name: "n1"},
		[]*model.Service{{Key: web, Local: true, Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP}}}}, nil,
		[]*model.LocalPod{{UID: "u1", Namespace: "shop", Name: "web-1", Ready: true, Protocol: model.ProtocolHTTP,
			IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")}, Services: []model.ServiceKey{web}}})
	agentReg := open(id, false)
	e := newEndpointRegistrar(agentReg, log)
	ready := newReadiness(partitionClaimPart)
	go watchClaim(ctx, agentReg, e, ready, 100*time.Millisecond)

	if err := e.sync(ctx, m); !errors.Is(err, registry.ErrPartitionClaimed) {
		t.Fatalf("sync into another cluster's partition: %v, want ErrPartitionClaimed", err)
	}
	testenv.Eventually(t, 30*time.Second, "readiness names the claim", func() error {
		err := ready.state()
		if err == nil || !strings.Contains(err.Error(), `"uid-other"`) || !strings.Contains(err.Error(), id) ||
			!strings.Contains(err.Error(), "reclaim-partition") || !strings.Contains(err.Error(), partitionClaimPart) {
			return fmt.Errorf("readiness %v", err)
		}
		return nil
	})
	if err := wantKeys(east.ClaimKey())(); err != nil {
		t.Fatalf("refused agent: %v", err)
	}

	// Re-claimed for the agent's cluster: the next sync registers, readiness passes.
	if _, _, err := open(id, true).Reclaim(ctx, "uid-other"); err != nil {
		t.Fatal(err)
	}
	if err := e.sync(ctx, m); err != nil {
		t.Fatalf("sync after the re-claim: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, "ready after the re-claim", ready.state)
	if err := wantKeys(east.ClaimKey(), epKey)(); err != nil {
		t.Fatal(err)
	}

	// Another cluster takes the partition (back): the agent withdraws its endpoints.
	if _, _, err := other.Reclaim(ctx, id); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "endpoint withdrawn", wantKeys(east.ClaimKey()))
	if err := ready.state(); err == nil {
		t.Fatal("ready while another cluster holds the partition")
	}
}

// TestAgentUnreadableClaimNotReady: a claim that is not a PartitionClaim (written by hand, by
// an old tool) refuses every write of the agent as a conflicting one does, so readiness part
// partition-claim must fail too, naming the key, and pass again once the key is deleted.
// Before, the part kept its last state: an agent that had been ready stayed ready while it
// registered nothing.
func TestAgentUnreadableClaimNotReady(t *testing.T) {
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, err := registry.New(registry.Config{Endpoints: etcd.Endpoints, Region: "eu", Cluster: "east", LeaseTTL: 5 * time.Second,
		Logger: log, ClusterID: "uid-east"})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	ready := newReadiness(partitionClaimPart)
	go watchClaim(ctx, reg, newEndpointRegistrar(reg, log), ready, 100*time.Millisecond)
	testenv.Eventually(t, 30*time.Second, "ready with no claim", ready.state)

	key := reg.Origin().ClaimKey()
	if _, err := reg.Client().Put(ctx, key, "not a claim"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "not ready with an unreadable claim", func() error {
		if err := ready.state(); err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), partitionClaimPart) {
			return fmt.Errorf("readiness %v, want %s failing naming %s", err, partitionClaimPart, key)
		}
		return nil
	})
	if _, err := reg.Client().Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "ready after the claim key is deleted", ready.state)
}
