package registry

import (
	"reflect"
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
)

// ToModelExport takes the origin from the key path and keeps every port's protocol (the
// per-port merge compares protocols).
func TestToModelExport(t *testing.T) {
	o := Origin{Region: "eu", Cluster: "alpha"}
	rec := Record[*registryv1.ExportMark]{Key: o.ExportKey("shop", "cart"), Origin: o, Value: &registryv1.ExportMark{
		Service: &registryv1.ServiceRef{Namespace: "shop", Name: "cart"}, ClusterName: "forged", Region: "forged",
		CreateTime: "2026-01-02T03:04:05.5Z",
		Ports: []*registryv1.ServicePort{
			{Name: "http", Port: 80, TargetPort: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP},
			{Name: "dns", Port: 53, Protocol: registryv1.Protocol_PROTOCOL_UDP},
			{Name: "api", Port: 9090, TargetPort: 9091, Protocol: registryv1.Protocol_PROTOCOL_GRPC},
		},
	}}
	want := model.ExportMark{
		Service: model.ServiceKey{Namespace: "shop", Name: "cart"}, Cluster: "alpha", Region: "eu",
		Created: time.Date(2026, 1, 2, 3, 4, 5, 5e8, time.UTC),
		Ports: []model.ServicePort{
			{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP},
			{Name: "dns", Port: 53, Protocol: model.ProtocolUDP},
			{Name: "api", Port: 9090, TargetPort: 9091, Protocol: model.ProtocolGRPC},
		},
	}
	if got := ToModelExport(rec); !reflect.DeepEqual(got, want) {
		t.Errorf("ToModelExport = %+v\nwant %+v", got, want)
	}
}
