package model

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

// TestResolveInbound: the selecting policy over the namespace-wide one over the mesh default,
// the oldest of one scope, unset modes inheriting, per-port modes from the deciding policy only,
// policies of other namespaces ignored, and every port an enforced authorization policy covers
// made strict (never by a dry run).
func TestResolveInbound(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	sel := func(k, v string) labels.Selector { return labels.SelectorFromSet(labels.Set{k: v}) }
	ns := func(name string, mode MTLSMode, age int, ports map[uint32]MTLSMode) PeerAuthn {
		return PeerAuthn{Namespace: "shop", Name: name, Mode: mode, PortModes: ports, Created: t0.Add(time.Duration(age) * time.Second)}
	}
	withSel := func(p PeerAuthn, s labels.Selector) PeerAuthn { p.Selector = s; return p }
	podLabels := map[string]string{"app": "cart"}
	allow := &AuthzPolicy{Namespace: "shop", Name: "only-web", Action: AuthzAllow, Rules: []AuthzRule{{AnySource: true, Ports: []uint32{8080}}}}
	denyPort := &AuthzPolicy{Namespace: "shop", Name: "no-admin", Action: AuthzDeny, Rules: []AuthzRule{{AnySource: true, Ports: []uint32{9090}}}}
	dry := &AuthzPolicy{Namespace: "shop", Name: "try", Action: AuthzAllow, DryRun: true, Rules: []AuthzRule{{AnySource: true}}}
	for _, tc := range []struct {
		name  string
		def   MTLSMode
		pas   []PeerAuthn
		authz []*AuthzPolicy
		want  string
	}{
		{"mesh default", MTLSPermissive, nil, nil, "PERMISSIVE strict=[] permissive=[] policy= authz=[]"},
		{"unset default is strict", MTLSUnset, nil, nil, "STRICT strict=[] permissive=[] policy= authz=[]"},
		{"namespace-wide permissive", MTLSStrict, []PeerAuthn{ns("migrate", MTLSPermissive, 0, nil)}, nil, "PERMISSIVE strict=[] permissive=[] policy=shop/migrate authz=[]"},
		{"another namespace's policy ignored", MTLSStrict, []PeerAuthn{{Namespace: "web", Name: "x", Mode: MTLSPermissive}}, nil, "STRICT strict=[] permissive=[] policy= authz=[]"},
		{"the selecting policy wins", MTLSStrict, []PeerAuthn{ns("migrate", MTLSPermissive, 0, nil), withSel(ns("cart", MTLSStrict, 5, nil), sel("app", "cart"))}, nil, "STRICT strict=[] permissive=[] policy=shop/cart authz=[]"},
		{"a selector that does not match", MTLSStrict, []PeerAuthn{ns("migrate", MTLSPermissive, 0, nil), withSel(ns("pay", MTLSStrict, 5, nil), sel("app", "pay"))}, nil, "PERMISSIVE strict=[] permissive=[] policy=shop/migrate authz=[]"},
		{"unset inherits the namespace's", MTLSStrict, []PeerAuthn{ns("migrate", MTLSPermissive, 0, nil), withSel(ns("cart", MTLSUnset, 5, map[uint32]MTLSMode{8080: MTLSStrict}), sel("app", "cart"))}, nil, "PERMISSIVE strict=[8080] permissive=[] policy=shop/cart authz=[]"},
		{"oldest namespace-wide wins", MTLSStrict, []PeerAuthn{ns("b-new", MTLSStrict, 9, nil), ns("a-old", MTLSPermissive, 1, nil)}, nil, "PERMISSIVE strict=[] permissive=[] policy=shop/a-old authz=[]"},
		{"same age: smaller name", MTLSStrict, []PeerAuthn{ns("zz", MTLSStrict, 1, nil), ns("aa", MTLSPermissive, 1, nil)}, nil, "PERMISSIVE strict=[] permissive=[] policy=shop/aa authz=[]"},
		{"strict with one permissive port", MTLSStrict, []PeerAuthn{ns("metrics", MTLSUnset, 0, map[uint32]MTLSMode{9090: MTLSPermissive, 8080: MTLSStrict})}, nil, "STRICT strict=[] permissive=[9090] policy=shop/metrics authz=[]"},
		{"port modes only from the deciding policy", MTLSStrict, []PeerAuthn{ns("metrics", MTLSUnset, 0, map[uint32]MTLSMode{9090: MTLSPermissive}), withSel(ns("cart", MTLSStrict, 5, nil), sel("app", "cart"))}, nil, "STRICT strict=[] permissive=[] policy=shop/cart authz=[]"},
		{"an ALLOW policy makes the pod strict", MTLSPermissive, nil, []*AuthzPolicy{allow}, "STRICT strict=[] permissive=[] policy= authz=[] all"},
		{"a DENY policy its ports", MTLSPermissive, nil, []*AuthzPolicy{denyPort}, "PERMISSIVE strict=[9090] permissive=[] policy= authz=[9090]"},
		{"authorization closes a permissive port in strict mode", MTLSStrict, []PeerAuthn{ns("metrics", MTLSUnset, 0, map[uint32]MTLSMode{9090: MTLSPermissive})}, []*AuthzPolicy{denyPort}, "STRICT strict=[] permissive=[] policy=shop/metrics authz=[9090]"},
		{"a fail-closed policy the pod", MTLSPermissive, nil, []*AuthzPolicy{{Namespace: "shop", Name: "bad", Action: AuthzDeny, FailClosed: true}}, "STRICT strict=[] permissive=[] policy= authz=[] all"},
		{"an ALLOW policy closes permissive ports of a strict pod", MTLSStrict, []PeerAuthn{ns("metrics", MTLSUnset, 0, map[uint32]MTLSMode{9090: MTLSPermissive})}, []*AuthzPolicy{allow}, "STRICT strict=[] permissive=[] policy=shop/metrics authz=[] all"},
		{"a DENY rule without ports the pod", MTLSPermissive, nil, []*AuthzPolicy{{Namespace: "shop", Name: "d", Action: AuthzDeny, Rules: []AuthzRule{{AnySource: true}}}}, "STRICT strict=[] permissive=[] policy= authz=[] all"},
		{"a dry run changes nothing", MTLSPermissive, nil, []*AuthzPolicy{dry}, "PERMISSIVE strict=[] permissive=[] policy= authz=[]"},
		{"already strict ports are not authorization's", MTLSPermissive, []PeerAuthn{ns("p", MTLSUnset, 0, map[uint32]MTLSMode{9090: MTLSStrict})}, []*AuthzPolicy{denyPort}, "PERMISSIVE strict=[9090] permissive=[] policy=shop/p authz=[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ResolveInbound(tc.def, tc.pas, "shop", podLabels, tc.authz)
			s := fmt.Sprintf("%s strict=%v permissive=%v policy=%s authz=%v", got.Mode, got.StrictPorts, got.PermissivePorts, got.Policy, got.AuthzStrict)
			if got.AuthzAll {
				s += " all"
			}
			if s != tc.want {
				t.Errorf("got  %s\nwant %s", s, tc.want)
			}
		})
	}
}
