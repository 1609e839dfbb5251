package agent

import (
	"context"
	"fmt"
	"sync"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/xds"
)

// attachments is the node's set of captured pods' CNI attachments, by pod UID: the assembler's
// model.AttachmentView. It starts from the attachments persisted before a restart.
type attachments struct {
	mu   sync.Mutex
	pods map[string]cniv1.PodAttachment
	// uncaptured are the attachments of pods left alone (model.UncapturedView).
	uncaptured map[string]cniv1.PodAttachment
}

func newAttachments(initial map[string]cniv1.PodAttachment) *attachments {
	a := &attachments{pods: make(map[string]cniv1.PodAttachment, len(initial)), uncaptured: map[string]cniv1.PodAttachment{}}
	for k, v := range initial {
		a.pods[k] = v
	}
	return a
}

// Attachments implements model.AttachmentView.
func (a *attachments) Attachments() map[string]cniv1.PodAttachment {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]cniv1.PodAttachment, len(a.pods))
	for k, v := range a.pods {
		out[k] = v
	}
	return out
}

// Uncaptured implements model.UncapturedView.
func (a *attachments) Uncaptured() map[string]cniv1.PodAttachment {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]cniv1.PodAttachment, len(a.uncaptured))
	for k, v := range a.uncaptured {
		out[k] = v
	}
	return out
}

// podDataplane is the agent's cni.Dataplane: it records a pod's attachment, has the assembler
// rebuild, and returns once the node proxy serves a model holding the pod: acked reports when
// Envoy has ACKed a model (pusher.waitAcked); served, when Envoy has ACKed a snapshot that
// serves the pod (the identity provider had its SVID: xds.Server.WaitPodServed); warm, when the
// named listeners have left warming, so they accept connections (envoy.WaitListenersWarm).
type podDataplane struct {
	att    *attachments
	asm    *model.Assembler
	acked  func(ctx context.Context, m *model.Mesh) error
	served func(ctx context.Context, uid string) error
	warm   func(ctx context.Context, listeners []string) error
}

// PodAdded implements cni.Dataplane: it records the pod, triggers a rebuild and waits until a
// model holding the pod has been built and ACKed by Envoy and the pod's listeners have left
// warming (their routes and secrets arrived), or ctx ends.
func (d *podDataplane) PodAdded(ctx context.Context, p model.LocalPod) error {
	d.att.mu.Lock()
	prev, had := d.att.pods[p.UID]
	d.att.pods[p.UID] = cniv1.PodAttachment{ContainerID: p.ContainerID, PodUID: p.UID, Namespace: p.Namespace,
		Name: p.Name, NetnsPath: p.NetnsPath, IPs: p.IPs, Interface: "eth0"}
	d.att.mu.Unlock()
	d.asm.Trigger()
	// A pod announced again (a CNI repair pass, a restarted agent's persisted attachments) does
	// not wait for its SVID: it is served as soon as the identity provider has it, and a repair
	// pass must not stall on each pod while the SPIRE agent is away.
	again := had && prev.ContainerID == p.ContainerID
	return d.waitModel(ctx, p.UID, p.ContainerID, true, !again)
}

// PodRemoved implements cni.Dataplane; it returns once a model without the pod is acknowledged.
// It removes the pod only while p's container is the one the pod is served with (or p names no
// container): the release of a stale attachment of a pod whose sandbox was recreated (repair,
// GC, a late DEL) must not take the live sandbox's listeners.
func (d *podDataplane) PodRemoved(ctx context.Context, p model.LocalPod) error {
	d.att.mu.Lock()
	cur, had := d.att.pods[p.UID]
	stale := had && p.ContainerID != "" && cur.ContainerID != p.ContainerID
	if had && !stale {
		delete(d.att.pods, p.UID)
	}
	d.att.mu.Unlock()
	if !had || stale {
		return nil
	}
	d.asm.Trigger()
	return d.waitModel(ctx, p.UID, "", false, false)
}

// waitModel waits for a model in which pod uid is present with container containerID (or
// absent), then for Envoy's ACK of it and, for a present pod, when served is set, for Envoy's
// ACK of a snapshot serving it (its SVID), then for its listeners to leave warming. The container matters when a pod's sandbox is recreated: the model already holds
// the pod with the old sandbox's netns until it is rebuilt.
func (d *podDataplane) waitModel(ctx context.Context, uid, containerID string, present, served bool) error {
	m, err := d.asm.Wait(ctx, func(m *model.Mesh) bool {
		p := m.Pod(uid)
		if !present {
			return p == nil
		}
		return p != nil && p.ContainerID == containerID
	})
	if err != nil {
		verb := "appear in"
		if !present {
			verb = "leave"
		}
		return fmt.Errorf("pod %s did not %s the mesh model: %w", uid, verb, err)
	}
	if d.acked != nil {
		if err := d.acked(ctx, m); err != nil {
			return err
		}
	}
	if !present {
		return nil
	}
	if served && d.served != nil {
		if err := d.served(ctx, uid); err != nil {
			return err
		}
	}
	if d.warm != nil {
		return d.warm(ctx, xds.PodListenerNames(m.Pod(uid)))
	}
	return nil
}

// UncapturedAdded implements cni.UncapturedObserver: it records the attachment of a pod left
// alone and has the assembler rebuild (an edge Gateway's pod is served from there).
func (d *podDataplane) UncapturedAdded(a cniv1.PodAttachment) {
	d.att.mu.Lock()
	d.att.uncaptured[a.PodUID] = a
	d.att.mu.Unlock()
	d.asm.Trigger()
}

// UncapturedRemoved implements cni.UncapturedObserver: it forgets the attachment (when it is
// the one recorded: a newer sandbox's stays).
func (d *podDataplane) UncapturedRemoved(a cniv1.PodAttachment) {
	d.att.mu.Lock()
	cur, ok := d.att.uncaptured[a.PodUID]
	if ok && (a.ContainerID == "" || cur.ContainerID == a.ContainerID) {
		delete(d.att.uncaptured, a.PodUID)
	}
	d.att.mu.Unlock()
	d.asm.Trigger()
}
