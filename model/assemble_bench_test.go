package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// BenchmarkAssemble measures one full model assembly (what the agent does per coalesced change)
// with 100 imported services sharing 10k remote endpoints, and 10k services sharing 100k; the
// endpoints come unordered, or "sorted" by service, cluster and pod UID as the agent's registry
// view hands them out (then no per-service sort is needed).
//
//	go test ./model/ -run '^$' -bench Assemble -benchmem
func BenchmarkAssemble(b *testing.B) {
	for _, size := range []struct {
		services, endpoints int
		sorted              bool
	}{{100, 10_000, false}, {100, 10_000, true}, {10_000, 100_000, false}, {10_000, 100_000, true}} {
		b.Run(fmt.Sprintf("services=%d/endpoints=%d/sorted=%v", size.services, size.endpoints, size.sorted), func(b *testing.B) {
			in := Sources{Cluster: "a", MeshDomain: "mesh", MeshNamespaces: map[string]bool{"shop": true}}
			for i := 0; i < size.services; i++ {
				name := fmt.Sprintf("svc-%d", i)
				in.Imports = append(in.Imports, &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
					Spec: mcsv1beta1.ServiceImportSpec{IPs: []string{fmt.Sprintf("10.97.%d.%d", i/250, i%250+1)},
						Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}})
				in.Exports = append(in.Exports, ExportMark{Service: ServiceKey{Namespace: "shop", Name: name}, Cluster: "b", Region: "eu"})
			}
			for i := 0; i < size.endpoints; i++ {
				in.Endpoints = append(in.Endpoints, Endpoint{
					Service: ServiceKey{Namespace: "shop", Name: fmt.Sprintf("svc-%d", i%size.services)}, Cluster: "b", Region: "eu",
					PodUID: fmt.Sprintf("pod-%d", i), IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(100 + i/65536), byte(i / 256), byte(i)})},
					Ports: []EndpointPort{{Name: "http", Port: 8080, Protocol: ProtocolHTTP}}, Healthy: true,
				})
			}
			if size.sorted {
				slices.SortFunc(in.Endpoints, func(a, c Endpoint) int {
					return cmp.Or(a.Service.Compare(c.Service), strings.Compare(a.Cluster, c.Cluster), strings.Compare(a.PodUID, c.PodUID))
				})
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				m := Assemble(uint64(i), in)
				if len(m.Services) != size.services {
					b.Fatalf("services = %d", len(m.Services))
				}
			}
		})
	}
}
