package model

import (
	"os"
	"regexp"
	"strings"
	"testing"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// TestRoutingDocsExamples keeps docs/routing.md's route examples true: each YAML block (a whole
// route, or rules to put under an HTTPRoute on Service shop/reviews) decodes strictly into the
// Gateway API types and converts to the model with nothing Unsupported. The status example is
// not a route and is left out.
func TestRoutingDocsExamples(t *testing.T) {
	b, err := os.ReadFile("../docs/routing.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(b), -1)
	routes := 0
	for i, m := range blocks {
		y := m[1]
		if strings.Contains(y, "\nstatus:") {
			continue
		}
		if strings.HasPrefix(y, "  rules:") {
			y = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: example, namespace: shop}\n" +
				"spec:\n  parentRefs:\n  - {group: \"\", kind: Service, name: reviews, port: 80}\n" + y
		}
		var r Route
		if strings.Contains(y, "kind: GRPCRoute") {
			var g gwv1.GRPCRoute
			if err := yaml.UnmarshalStrict([]byte(y), &g); err != nil {
				t.Errorf("block %d: %v\n%s", i, err, y)
				continue
			}
			r = GRPCRouteModel(&g)
		} else {
			var h gwv1.HTTPRoute
			if err := yaml.UnmarshalStrict([]byte(y), &h); err != nil {
				t.Errorf("block %d: %v\n%s", i, err, y)
				continue
			}
			r = HTTPRouteModel(&h)
		}
		routes++
		if len(r.Parents) == 0 || len(r.Rules) == 0 {
			t.Errorf("block %d: %d parents, %d rules", i, len(r.Parents), len(r.Rules))
		}
		for j, rule := range r.Rules {
			if len(rule.Unsupported) > 0 {
				t.Errorf("block %d rule %d: %v", i, j, rule.Unsupported)
			}
		}
	}
	if routes < 8 {
		t.Errorf("%d route examples in docs/routing.md, want the 8 it shows", routes)
	}
}
