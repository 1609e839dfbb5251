package agent

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/cni"
	"github.com/aethermesh/aether/model"
)

// inboundDefault fills model.Sources.InboundDefault with the agent's --inbound-mode.
type inboundDefault model.MTLSMode

// Fill sets s.InboundDefault.
func (d inboundDefault) Fill(s *model.Sources) error {
	s.InboundDefault = model.MTLSMode(d)
	return nil
}

// mtlsMode is the model's mode of --inbound-mode ("strict", "permissive").
func mtlsMode(flag string) model.MTLSMode {
	if strings.EqualFold(flag, "permissive") {
		return model.MTLSPermissive
	}
	return model.MTLSStrict
}

// cniInbound turns the model's inbound mTLS policies (model.Mesh.Inbound, by pod UID) into the
// CNI server's (cni.Server.SetInboundPolicies): each pod's mode and its per-port exceptions.
//
// The inbound (15008) and capture (15001) ports have fixed rules (15008 always takes mTLS, 15001
// is Envoy's): a policy naming them (a tenant's DENY rule on port 15008, which ResolveInbound
// makes a strict port of a permissive pod) changes nothing, and they are left out of both lists.
// reserved are other ports of this node's capture that a policy may not name (its --dns-port when
// it is not the default 18054, which the PeerAuthentication conversion refuses already): the CNI
// server would fail such an entry closed anyway. Such a port is never opened instead: it is left
// out of a strict pod's permissive ports, and a permissive pod with it among its strict ports
// becomes strict on every port (fail closed).
func cniInbound(m *model.Mesh, reserved []uint16) map[string]cni.PodInbound {
	out := make(map[string]cni.PodInbound, len(m.Inbound))
	fixed := func(port uint16) bool {
		return port == capture.DefaultInboundPort || port == capture.DefaultCapturePort
	}
	for uid, in := range m.Inbound {
		p := cni.PodInbound{Mode: capture.ModeStrict, StrictPorts: ports16(in.StrictPorts), PermissivePorts: ports16(in.PermissivePorts)}
		if in.Mode == model.MTLSPermissive {
			p.Mode = capture.ModePermissive
		}
		p.StrictPorts, p.PermissivePorts = slices.DeleteFunc(p.StrictPorts, fixed), slices.DeleteFunc(p.PermissivePorts, fixed)
		isReserved := func(port uint16) bool { return slices.Contains(reserved, port) }
		p.PermissivePorts = slices.DeleteFunc(p.PermissivePorts, isReserved)
		if slices.ContainsFunc(p.StrictPorts, isReserved) {
			p = cni.PodInbound{Mode: capture.ModeStrict}
		}
		out[uid] = p
	}
	return out
}

// ports16 converts ports (1 to 65535 in the model) to the capture's port type.
func ports16(ps []uint32) []uint16 {
	if len(ps) == 0 {
		return nil
	}
	out := make([]uint16, 0, len(ps))
	for _, p := range ps {
		if p > 0 && p <= 0xffff {
			out = append(out, uint16(p))
		}
	}
	return out
}

// inboundSync follows the models on latest until ctx ends and gives the CNI server every pod's
// inbound mTLS policy (set: cni.Server.SetInboundPolicies; reserved: see cniInbound) whenever it
// changed; a failed set is tried again after retry with the newest model (the CNI server applies
// it to the pods it did not reach).
func inboundSync(ctx context.Context, latest chan *model.Mesh, set func(context.Context, map[string]cni.PodInbound) error, reserved []uint16, retry time.Duration, log *slog.Logger) {
	var last map[string]cni.PodInbound
	var overridden map[string]string // authzOverrides of the last model set, logged when they change
	var cur *model.Mesh
	var tick <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case cur = <-latest:
		case <-tick:
		}
		tick = nil
		if cur == nil {
			continue
		}
		want := cniInbound(cur, reserved)
		if last != nil && maps.EqualFunc(last, want, samePodInbound) {
			continue
		}
		if err := set(ctx, want); err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Error("inbound mTLS policies not applied to every pod; trying again", "pods", len(want), "retry", retry, "err", err)
			last, tick = nil, time.After(retry)
			continue
		}
		last = want
		over := authzOverrides(cur)
		for _, pod := range slices.Sorted(maps.Keys(over)) {
			if over[pod] != overridden[pod] {
				log.Info("authorization makes pod strict over its mTLS mode", "pod", pod, "strict", over[pod])
			}
		}
		overridden = over
	}
}

// authzOverrides describes, by pod "<ns>/<name>", where authorization made a pod stricter than
// its PeerAuthentication (or the mesh default) asked (model.PodInbound.AuthzAll, AuthzStrict): a
// policy judges the caller's certificate, so the ports it covers refuse plaintext. Each value
// names the ports ("every port", or "ports 8080,9090") and the PeerAuthentication overridden.
// Pods without an override are not in it.
func authzOverrides(m *model.Mesh) map[string]string {
	out := map[string]string{}
	for _, p := range m.Pods {
		in, ok := m.Inbound[p.UID]
		if !ok || (!in.AuthzAll && len(in.AuthzStrict) == 0) {
			continue
		}
		what := "every port"
		if !in.AuthzAll {
			ports := make([]string, len(in.AuthzStrict))
			for i, port := range in.AuthzStrict {
				ports[i] = strconv.FormatUint(uint64(port), 10)
			}
			what = "ports " + strings.Join(ports, ",")
		}
		by := "the mesh default"
		if in.Policy != "" {
			by = "PeerAuthentication " + in.Policy
		}
		out[p.Namespace+"/"+p.Name] = what + " (over " + by + ")"
	}
	return out
}

// samePodInbound reports whether two policies are equal field by field.
func samePodInbound(a, b cni.PodInbound) bool {
	return a.Mode == b.Mode && slices.Equal(a.StrictPorts, b.StrictPorts) && slices.Equal(a.PermissivePorts, b.PermissivePorts)
}
