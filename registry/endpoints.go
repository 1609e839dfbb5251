package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
)

// maxTxnOps is how many puts one re-registration transaction carries (etcd's default
// --max-txn-ops is 128).
const maxTxnOps = 128

// RegisterEndpoint validates ep and writes it under
// .../endpoints/<ns>/<svc>/<kubernetes.pod_uid>, bound to this writer's lease (granted on first
// use and kept alive until Close). Empty cluster_name and region are filled with the writer's
// origin; any other value is refused with ErrOutsidePrefix. The endpoint stays registered (and is
// re-registered under a new lease after a lost lease) until DeregisterEndpoint. It returns a
// *ValidationError for an invalid record and the etcd error when the write fails; a failed
// write leaves nothing to re-register.
func (r *Registry) RegisterEndpoint(ctx context.Context, ep *registryv1.ServiceEndpoint) error {
	if err := r.checkOrigin("cluster_name", ep.GetClusterName(), r.origin.Cluster); err != nil {
		return fmt.Errorf("register endpoint: %w", err)
	}
	if err := r.checkOrigin("region", ep.GetRegion(), r.origin.Region); err != nil {
		return fmt.Errorf("register endpoint: %w", err)
	}
	ep = proto.Clone(ep).(*registryv1.ServiceEndpoint)
	ep.ClusterName, ep.Region = r.origin.Cluster, r.origin.Region
	if err := ValidateEndpoint(ep); err != nil {
		return fmt.Errorf("register endpoint: %w", err)
	}
	key := r.origin.EndpointKey(ep.Service.Namespace, ep.Service.Name, ep.Kubernetes.PodUid)
	if err := r.checkOwn(key); err != nil {
		return fmt.Errorf("register endpoint: %w", err)
	}
	b, err := proto.Marshal(ep)
	if err != nil {
		return fmt.Errorf("register endpoint: marshal %q: %w", key, err)
	}
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if r.lease == 0 {
		if err := r.replaceLocked(ctx); err != nil {
			return fmt.Errorf("register endpoint %q: %w", key, err)
		}
	}
	err = r.write(ctx, clientv3.OpPut(key, string(b), clientv3.WithLease(r.lease)))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The lease expired before the keeper noticed: replace it now rather than fail.
		r.log.Warn("registry: endpoint lease lost; re-registering under a new lease", "lease", fmt.Sprintf("%x", int64(r.lease)))
		r.m.leaseLost.Inc()
		if err := r.replaceLocked(ctx); err != nil {
			return fmt.Errorf("register endpoint %q: %w", key, err)
		}
		err = r.write(ctx, clientv3.OpPut(key, string(b), clientv3.WithLease(r.lease)))
	}
	if err != nil {
		return fmt.Errorf("register endpoint %q: %w", key, err)
	}
	r.desired[key] = b
	return nil
}

// DeregisterEndpoint deletes the endpoint of pod podUID for service namespace/name from this
// writer's prefix and stops keeping it registered. Deleting a missing endpoint is not an error.
func (r *Registry) DeregisterEndpoint(ctx context.Context, namespace, name, podUID string) error {
	if err := validServiceRef(namespace, name, "service"); err != nil {
		return fmt.Errorf("deregister endpoint: %w", err)
	}
	if err := validPodUID(podUID); err != nil {
		return fmt.Errorf("deregister endpoint: %w", err)
	}
	key := r.origin.EndpointKey(namespace, name, podUID)
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if err := r.del(ctx, key); err != nil {
		return fmt.Errorf("deregister endpoint: %w", err)
	}
	delete(r.desired, key)
	return nil
}

// RevokeEndpoints revokes this writer's lease, which deletes every endpoint registered under it
// at once, and forgets them. The next RegisterEndpoint grants a new lease. A lease etcd no
// longer has (expired, or revoked already) is not an error: its endpoints are gone with it, and
// they are forgotten too, which also stops re-registering them (the lease keeper's retries).
func (r *Registry) RevokeEndpoints(ctx context.Context) error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if r.lease == 0 {
		return nil
	}
	if _, err := r.cli.Revoke(ctx, r.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoke endpoints: lease %x: %w", int64(r.lease), err)
	}
	r.setLeaseLocked(0)
	r.noteRevoked()
	clear(r.desired)
	return nil
}

// ListEndpoints returns every valid endpoint under Root (all regions and clusters) in key order,
// with the revision it was read at. Bad records are skipped, logged and counted.
func (r *Registry) ListEndpoints(ctx context.Context) ([]Record[*registryv1.ServiceEndpoint], int64, error) {
	recs, rev, err := list(ctx, r, endpointCodec)
	if err != nil {
		return nil, 0, fmt.Errorf("list endpoints: %w", err)
	}
	return recs, rev, nil
}

// WatchEndpoints watches every endpoint under Root (all regions and clusters). The first batch
// is a Snapshot of every valid endpoint as Added events; later batches carry typed Added,
// Updated and Deleted events (a lease expiry is a Deleted). After a lost connection or leader it
// resumes from the last revision it delivered; when that revision was compacted it re-lists and
// delivers exactly the difference (Relisted), deletions included, so a consumer applying every
// batch (Batch.Apply) converges to the store. Bad records are skipped, logged and counted; a
// record that turns bad is delivered as Deleted. The channel is closed when ctx ends or the
// Registry is closed; an unread channel stalls only this watch.
func (r *Registry) WatchEndpoints(ctx context.Context) <-chan Batch[*registryv1.ServiceEndpoint] {
	return watch(ctx, r, endpointCodec)
}

// Lease returns the writer's current endpoint lease (0 before the first registration) and a
// channel closed when it changes.
func (r *Registry) Lease() (clientv3.LeaseID, <-chan struct{}) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	return r.lease, r.leaseCh
}

func (r *Registry) setLeaseLocked(id clientv3.LeaseID) {
	r.lease = id
	close(r.leaseCh)
	r.leaseCh = make(chan struct{})
}

// keep drains the keepalive responses of lease id, recording each answer (KeepAliveStatus).
// clientv3 closes the channel when the lease
// expired or was revoked, or when no keepalive succeeded for a whole TTL (cut off, quorum
// loss). Then, unless the Registry is closing or the lease was replaced meanwhile, it grants a
// new lease and re-registers every desired endpoint under it, retrying with backoff until it
// succeeds.
func (r *Registry) keep(id clientv3.LeaseID, ka <-chan *clientv3.LeaseKeepAliveResponse) {
	defer r.wg.Done()
	for resp := range ka {
		r.noteAnswer(resp.ID, time.Now(), resp.TTL)
	}
	r.wmu.Lock()
	replaced := r.lease != id
	r.wmu.Unlock()
	if r.ctx.Err() != nil || replaced {
		return
	}
	r.log.Warn("registry: endpoint lease lost; re-registering under a new lease", "lease", fmt.Sprintf("%x", int64(id)))
	r.m.leaseLost.Inc()
	backoff := 200 * time.Millisecond
	for {
		done, err := r.reregister(id)
		if done {
			return
		}
		r.log.Warn("registry: re-registration failed; retrying", "err", err, "retry_in", backoff)
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// reregister replaces lost lease old (see replaceLocked). done is true when finished or when
// nothing is left to do (closing, lease already replaced or revoked).
func (r *Registry) reregister(old clientv3.LeaseID) (done bool, err error) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if r.ctx.Err() != nil || r.lease != old {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(r.ctx, time.Duration(r.ttl)*time.Second)
	defer cancel()
	if err := r.replaceLocked(ctx); err != nil {
		return false, err
	}
	return true, nil
}

// replaceLocked grants a new lease, re-puts every desired endpoint under it, starts keeping it
// alive and revokes the old one (best effort: it removes stale keys still bound to it). Callers
// hold wmu. On error the old lease stays current and the new one is revoked.
func (r *Registry) replaceLocked(ctx context.Context) error {
	if r.closed {
		return ErrClosed
	}
	old := r.lease
	resp, err := r.cli.Grant(ctx, r.ttl)
	if err != nil {
		return fmt.Errorf("grant lease: %w", err)
	}
	ops := make([]clientv3.Op, 0, maxTxnOps)
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		err := r.write(ctx, ops...)
		ops = ops[:0]
		return err
	}
	for k, v := range r.desired {
		ops = append(ops, clientv3.OpPut(k, string(v), clientv3.WithLease(resp.ID)))
		if len(ops) == maxTxnOps {
			if err := flush(); err != nil {
				r.revokeQuietly(resp.ID)
				return fmt.Errorf("re-register endpoints: %w", err)
			}
		}
	}
	if err := flush(); err != nil {
		r.revokeQuietly(resp.ID)
		return fmt.Errorf("re-register endpoints: %w", err)
	}
	ka, err := r.cli.KeepAlive(r.ctx, resp.ID)
	if err != nil {
		r.revokeQuietly(resp.ID)
		return fmt.Errorf("keep lease %x alive: %w", int64(resp.ID), err)
	}
	if old != 0 {
		r.revokeQuietly(old)
	}
	r.setLeaseLocked(resp.ID)
	r.noteGrant(resp.ID, time.Now(), resp.TTL, old != 0)
	r.log.Info("registry: endpoints registered under a new lease", "lease", fmt.Sprintf("%x", int64(resp.ID)),
		"old_lease", fmt.Sprintf("%x", int64(old)), "endpoints", len(r.desired))
	r.wg.Add(1)
	go r.keep(resp.ID, ka)
	return nil
}

// revokeQuietly revokes a lease, ignoring errors (it may be gone already).
func (r *Registry) revokeQuietly(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(r.ctx, 2*time.Second)
	defer cancel()
	_, _ = r.cli.Revoke(ctx, id)
}
