package xds

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/model"
)

// TestStreamPanicRecovered: a panic in an ADS stream's handler (planted in the request callback
// for listeners) ends that stream with codes.Internal and is counted; the server keeps serving:
// a new stream from the same node gets the clusters of the current snapshot, over SotW and delta.
func TestStreamPanicRecovered(t *testing.T) {
	ca, _ := testCA(t, model.DefaultTrustDomain, time.Hour)
	reg := prometheus.NewRegistry()
	s, err := NewServer(ServerOptions{NodeID: "n", Identity: identity.NewRotator(ca).Provider(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	s.testHook = func(typeURL string) {
		if typeURL == resource.ListenerType {
			panic("planted panic")
		}
	}
	if _, err := s.SetMesh(context.Background(), model.New(1, "c1", "mesh", model.DefaultTrustDomain, model.Node{Name: "n"}, nil, nil, nil)); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "xds.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ads := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn)
	node := &core.Node{Id: "n"}
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()

	// SotW: the listener request panics, the stream ends with Internal.
	st, err := ads.StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.Internal {
		t.Fatalf("stream after a panicking request: %v, want code Internal", err)
	}
	if got := counterValue(t, s.panics); got != 1 {
		t.Fatalf("aether_xds_stream_panics_total = %v, want 1", got)
	}
	// A new stream is served.
	st, err = ads.StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil || resp.GetTypeUrl() != resource.ClusterType || !strings.Contains(resp.GetVersionInfo(), s.epoch) {
		t.Fatalf("clusters on a new stream after the panic: %v, %v", resp, err)
	}

	// Delta: the same.
	ds, err := ads.DeltaAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	if _, err := ds.Recv(); status.Code(err) != codes.Internal {
		t.Fatalf("delta stream after a panicking request: %v, want code Internal", err)
	}
	if got := counterValue(t, s.panics); got != 2 {
		t.Fatalf("aether_xds_stream_panics_total = %v, want 2", got)
	}
	ds, err = ads.DeltaAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if dr, err := ds.Recv(); err != nil || dr.GetTypeUrl() != resource.ClusterType {
		t.Fatalf("delta clusters on a new stream after the panic: %v, %v", dr, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
