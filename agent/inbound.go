package agent

import (
	"context"
	"log/slog"
	"maps"
	"slices"
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
// CNI server's (cni.Server.SetInboundPolicies): each pod's mode and its per-port exceptions,
// without aether's own ports (reserved: the inbound, capture and DNS ports, whose rules are
// fixed), which a policy naming them (a DENY rule on port 15008, say) must not bring into a
// pod's per-port rules.
func cniInbound(m *model.Mesh, reserved ...uint16) map[string]cni.PodInbound {
	out := make(map[string]cni.PodInbound, len(m.Inbound))
	keep := func(ps []uint16) []uint16 {
		ps = slices.DeleteFunc(ps, func(p uint16) bool { return slices.Contains(reserved, p) })
		if len(ps) == 0 {
			return nil
		}
		return ps
	}
	for uid, in := range m.Inbound {
		p := cni.PodInbound{Mode: capture.ModeStrict, StrictPorts: keep(ports16(in.StrictPorts)), PermissivePorts: keep(ports16(in.PermissivePorts))}
		if in.Mode == model.MTLSPermissive {
			p.Mode = capture.ModePermissive
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
// inbound mTLS policy (cniInbound, without the reserved ports) (set: cni.Server.SetInboundPolicies) whenever it changed; a failed set is
// tried again after retry with the newest model (the CNI server applies it to the pods it did not
// reach).
func inboundSync(ctx context.Context, latest chan *model.Mesh, set func(context.Context, map[string]cni.PodInbound) error, retry time.Duration, log *slog.Logger, reserved ...uint16) {
	var last map[string]cni.PodInbound
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
		want := cniInbound(cur, reserved...)
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
	}
}

// samePodInbound reports whether two policies are equal field by field.
func samePodInbound(a, b cni.PodInbound) bool {
	return a.Mode == b.Mode && slices.Equal(a.StrictPorts, b.StrictPorts) && slices.Equal(a.PermissivePorts, b.PermissivePorts)
}
