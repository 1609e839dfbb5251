package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/xds"
)

// podDataplane is the agent's cni.Dataplane: it adds a pod's attachment to the model's sources
// and returns once the node proxy serves a model holding the pod (acked reports when Envoy has
// ACKed a model version; warm, when the named listeners have left warming, so they accept
// connections). It also implements model.AttachmentView for the assembler.
type podDataplane struct {
	asm   *model.Assembler
	acked func(ctx context.Context, m *model.Mesh) error
	warm  func(ctx context.Context, listeners []string) error

	mu   sync.Mutex
	pods map[string]model.PodAttachment // by pod UID
}

func newPodDataplane() *podDataplane {
	return &podDataplane{pods: map[string]model.PodAttachment{}}
}

// Attachments implements model.AttachmentView.
func (d *podDataplane) Attachments() map[string]model.PodAttachment {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]model.PodAttachment, len(d.pods))
	for k, v := range d.pods {
		out[k] = v
	}
	return out
}

// PodAdded implements cni.Dataplane: it records the pod, triggers a rebuild and waits until a
// model holding the pod has been built and ACKed by Envoy and the pod's listeners have left
// warming (their routes and secrets arrived), or ctx ends.
func (d *podDataplane) PodAdded(ctx context.Context, p model.LocalPod) error {
	d.mu.Lock()
	d.pods[p.UID] = model.PodAttachment{ContainerID: p.ContainerID, PodUID: p.UID, Namespace: p.Namespace,
		Name: p.Name, NetnsPath: p.NetnsPath, IPs: p.IPs, Interface: "eth0"}
	d.mu.Unlock()
	d.asm.Trigger()
	return d.waitModel(ctx, p.UID, true)
}

// PodRemoved implements cni.Dataplane; it returns once a model without the pod is acknowledged.
// It removes the pod only while p's container is the one the pod is served with (or p names no
// container): the release of a stale attachment of a pod whose sandbox was recreated (repair,
// GC, a late DEL) must not take the live sandbox's listeners.
func (d *podDataplane) PodRemoved(ctx context.Context, p model.LocalPod) error {
	d.mu.Lock()
	cur, had := d.pods[p.UID]
	stale := had && p.ContainerID != "" && cur.ContainerID != p.ContainerID
	if had && !stale {
		delete(d.pods, p.UID)
	}
	d.mu.Unlock()
	if !had || stale {
		return nil
	}
	d.asm.Trigger()
	return d.waitModel(ctx, p.UID, false)
}

func (d *podDataplane) waitModel(ctx context.Context, uid string, present bool) error {
	for {
		if m := d.asm.Current(); m != nil && (m.Pod(uid) != nil) == present {
			if d.acked != nil {
				if err := d.acked(ctx, m); err != nil {
					return err
				}
			}
			if present && d.warm != nil {
				return d.warm(ctx, xds.PodListenerNames(m.Pod(uid)))
			}
			return nil
		}
		select {
		case <-ctx.Done():
			verb := "appear in"
			if !present {
				verb = "leave"
			}
			return fmt.Errorf("pod %s did not %s the mesh model: %w", uid, verb, context.Cause(ctx))
		case <-time.After(10 * time.Millisecond):
		}
	}
}
