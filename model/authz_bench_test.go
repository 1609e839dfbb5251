package model

import (
	"fmt"
	"testing"

	sec "github.com/aethermesh/aether/api/aether/security/v1alpha1"
)

// BenchmarkResolveAuthz measures what every model assembly spends on authorization: 1000
// AuthorizationPolicies of 20 rules each (service-account sources, ports, methods, a prefix and
// an exact path) resolved into the model's policies, converted anew or (cached) unchanged since
// the last assembly.
//
//	go test ./model/ -run '^$' -bench ResolveAuthz -benchmem
func BenchmarkResolveAuthz(b *testing.B) {
	var ps []*sec.AuthorizationPolicy
	for i := 0; i < 1000; i++ {
		ps = append(ps, authzPolicy(fmt.Sprintf("p-%d", i), func(p *sec.AuthorizationPolicy) {
			p.Spec.Rules = nil
			for j := 0; j < 20; j++ {
				p.Spec.Rules = append(p.Spec.Rules, sec.AuthorizationRule{
					Sources:           []sec.AuthorizationSource{{Type: sec.SourceServiceAccount, ServiceAccount: &sec.AuthorizationSourceServiceAccount{Namespace: "front", Name: fmt.Sprintf("sa-%d", j)}}},
					NetworkAttributes: &sec.AuthorizationNetworkAttributes{Ports: []int32{8080}},
					HTTP: &sec.AuthorizationHTTPAttributes{Methods: []sec.HTTPMethod{"GET"}, Paths: []sec.HTTPPathMatch{
						{Value: fmt.Sprintf("/api/%d", j)}, {Type: sec.PathMatchExact, Value: fmt.Sprintf("/v1/items/%d", j)},
					}},
				})
			}
		}))
	}
	exists := func(ServiceKey) bool { return true }
	for _, cached := range []bool{false, true} {
		b.Run(fmt.Sprintf("cached=%v", cached), func(b *testing.B) {
			var c *AuthzCache
			if cached {
				c = &AuthzCache{} // as the Assembler keeps it: every object unchanged since the last build
				resolveAuthz(ps, exists, c)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if r := resolveAuthz(ps, exists, c); len(r) != len(ps) || r[0].Policy == nil {
					b.Fatalf("resolved %d, first %+v", len(r), r[0])
				}
			}
		})
	}
}
