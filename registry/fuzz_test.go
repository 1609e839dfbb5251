package registry

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// FuzzDecodeRecord feeds arbitrary keys and values to every kind's decoder: it must return a
// record or an error, never panic, and a decoded record must carry its key's origin and pass
// validation.
func FuzzDecodeRecord(f *testing.F) {
	o := Origin{Region: "eu", Cluster: "alpha"}
	ep, _ := proto.Marshal(testEndpoint("shop", "cart", "uid-1", "10.0.0.1"))
	ex, _ := proto.Marshal(testExport())
	cf, _ := proto.Marshal(testConfig())
	f.Add(o.EndpointKey("shop", "cart", "uid-1"), ep)
	f.Add(o.ExportKey("shop", "cart"), ex)
	f.Add(o.ConfigKey("shop", "cart"), cf)
	f.Add(o.ConfigKey("shop", "cart"), ep)
	f.Add(Root+"eu/clusters/alpha/endpoints/shop/cart", []byte{0xff})
	f.Add(o.ClaimKey(), ex)
	f.Add("", []byte(nil))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		check := func(k Kind, origin Origin) {
			pk, perr := ParseKey(key)
			if perr != nil || pk.Kind != k || pk.Origin != origin {
				t.Fatalf("decoded %s record from key %q (parse %v, %v) with origin %v", k, key, pk, perr, origin)
			}
		}
		if r, err := endpointCodec.decode(key, value, 1); err == nil {
			if r.Value.ClusterName != r.Origin.Cluster || ValidateEndpoint(r.Value) != nil {
				t.Fatalf("endpoint record not stamped or invalid: %v", r.Value)
			}
			check(KindEndpoint, r.Origin)
		}
		if r, err := exportCodec.decode(key, value, 1); err == nil {
			if r.Value.ClusterName != r.Origin.Cluster || ValidateExport(r.Value) != nil {
				t.Fatalf("export record not stamped or invalid: %v", r.Value)
			}
			check(KindExport, r.Origin)
		}
		if r, err := configCodec.decode(key, value, 1); err == nil {
			if r.Value.OriginCluster != r.Origin.Cluster || ValidateConfig(r.Value) != nil {
				t.Fatalf("config record not stamped or invalid: %v", r.Value)
			}
			check(KindConfig, r.Origin)
		}
	})
}
