package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
)

// ErrPartitionClaimed is matched (errors.Is) by the error of every write refused because the
// writer's partition is claimed by another real cluster; the error is a *ClaimConflictError.
var ErrPartitionClaimed = errors.New("registry partition claimed by another cluster")

// ErrClaimUnreadable is matched (errors.Is) by the error of every claim check and write refused
// because the partition's claim key holds no valid PartitionClaim (written by hand or by another
// tool); the error names the key and how to clear it.
var ErrClaimUnreadable = errors.New("registry partition claim unreadable")

// ClaimConflictError reports a partition claimed by another real cluster than the writer's:
// two clusters were given the same cluster name (region and cluster).
type ClaimConflictError struct {
	// Origin is the partition (the writer's region and cluster name).
	Origin Origin
	// ClusterID is the writer's own cluster ID (Config.ClusterID).
	ClusterID string
	// Claim is the claim found in the registry.
	Claim *registryv1.PartitionClaim
}

// Error names the partition, the claiming cluster ID (with when and by whom it claimed) and the
// writer's own cluster ID.
func (e *ClaimConflictError) Error() string {
	return fmt.Sprintf("registry partition %s (cluster name %q) is claimed by cluster ID %q (claimed %s by %s), not by this cluster's ID %q",
		e.Origin, e.Origin.Cluster, e.Claim.GetClusterId(), e.Claim.GetClaimTime(), e.Claim.GetClaimedBy(), e.ClusterID)
}

// Is makes errors.Is(err, ErrPartitionClaimed) true.
func (e *ClaimConflictError) Is(target error) bool { return target == ErrPartitionClaimed }

// EnsureClaim checks the partition claim (Origin.ClaimKey) against this writer's
// Config.ClusterID and returns the claim in force (nil when there is none). A claimer
// (Config.Claimer, the registrar) creates the claim when the partition has none, in one etcd
// transaction (create if absent, else read), so of two clusters racing for one partition exactly
// one wins. A non-claimer (the agent) only reads it: an unclaimed partition may be written.
//
// It returns a *ClaimConflictError (errors.Is ErrPartitionClaimed) when another cluster ID holds
// the claim, an error naming the key (errors.Is ErrClaimUnreadable) when the stored claim is not
// a valid PartitionClaim, and the etcd error when etcd does not answer. After a successful check
// every write of this Registry is a transaction conditional on the claim being unchanged, so a
// claim taken by another cluster afterwards refuses the writes (they check again and fail)
// instead of racing them. aether_registry_partition_claim_conflict is 1 while the last check
// (the one that read the newest revision) found a conflict.
func (r *Registry) EnsureClaim(ctx context.Context) (*registryv1.PartitionClaim, error) {
	if r.clusterID == "" {
		return nil, errors.New("check partition claim: Config.ClusterID: required")
	}
	// Checks of one writer may overlap (the agent's periodic check and a write's re-check): the
	// outcome of one that read an older revision than a check already recorded is stale, and
	// is read again rather than recorded or returned.
	c, _, err := r.ensureClaim(ctx)
	return c, err
}

// ensureClaim is EnsureClaim; it also returns the etcd revision the returned outcome was read
// at (0 when etcd failed), from which WatchClaim watches.
func (r *Registry) ensureClaim(ctx context.Context) (*registryv1.PartitionClaim, int64, error) {
	for {
		c, rev, record, err := r.checkClaim(ctx)
		if record == nil || r.recordCheck(rev, record, err) {
			return c, rev, err
		}
	}
}

// checkClaim reads (and, for a claimer, creates) the claim once. It returns the claim in force,
// the revision it was read at, the state change the outcome calls for (record, applied by
// recordCheck unless a newer check was recorded meanwhile; nil when etcd failed) and the error
// EnsureClaim returns.
func (r *Registry) checkClaim(ctx context.Context) (claim *registryv1.PartitionClaim, rev int64, record func(), err error) {
	key := r.origin.ClaimKey()
	if err := r.checkUser(ctx); err != nil {
		var ue *UserError
		if !errors.As(err, &ue) {
			return nil, 0, nil, err // etcd did not answer: nothing to record
		}
		// Recorded (ClaimStatus reports it) at the newest recorded revision, so no write goes.
		r.cmu.Lock()
		rev := r.checkedRev
		r.cmu.Unlock()
		return nil, rev, func() { r.guard = nil }, err
	}
	// A linearizable read first: a claim that exists (every check but the first) costs no raft
	// proposal, which the create-if-absent transaction would (it holds a put).
	resp, err := r.cli.Get(ctx, key)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("check partition claim %s: %w", r.origin, err)
	}
	if r.afterClaimRead != nil {
		r.afterClaimRead()
	}
	rev = resp.Header.Revision
	var kv *mvccpb.KeyValue
	if len(resp.Kvs) > 0 {
		kv = resp.Kvs[0]
	} else if r.claimer {
		c := r.newClaim("")
		b, err := proto.Marshal(c)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("claim partition %s: marshal: %w", r.origin, err)
		}
		tr, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, string(b))).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return nil, 0, nil, fmt.Errorf("claim partition %s: %w", r.origin, err)
		}
		rev = tr.Header.Revision
		if tr.Succeeded {
			r.log.Info("registry: claimed the partition for this cluster", "key", key, "cluster_id", r.clusterID)
			return c, rev, func() { r.setGuardLocked(clientv3.Compare(clientv3.ModRevision(key), "=", rev)) }, nil
		}
		// Created meanwhile by another claimer: the compare failed in the same transaction,
		// so the key exists in the read.
		kv = tr.Responses[0].GetResponseRange().Kvs[0]
	} else {
		return nil, rev, func() { r.setGuardLocked(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)) }, nil
	}
	c, record, err := r.claimOutcome(kv)
	return c, rev, record, err
}

// claimOutcome decodes the stored claim kv (present) and returns it, the state change it calls
// for (see checkClaim) and the error a check finding it returns: nil when it names this
// writer's cluster ID, a *ClaimConflictError when another, an ErrClaimUnreadable error when it
// is not a valid PartitionClaim.
func (r *Registry) claimOutcome(kv *mvccpb.KeyValue) (*registryv1.PartitionClaim, func(), error) {
	c, err := decodeClaim(kv)
	if err != nil {
		return nil, func() { r.guard = nil }, err
	}
	if c.ClusterId != r.clusterID {
		cerr := &ClaimConflictError{Origin: r.origin, ClusterID: r.clusterID, Claim: c}
		return c, func() { r.setConflictLocked(cerr) }, cerr
	}
	key, modRev := string(kv.Key), kv.ModRevision
	return c, func() { r.setGuardLocked(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)) }, nil
}

// recordCheck applies the outcome of a claim check read at revision rev (apply, and outcome as
// what ClaimStatus reports), unless a check that read a newer revision was recorded already; it
// reports whether it applied it.
func (r *Registry) recordCheck(rev int64, apply func(), outcome error) bool {
	r.cmu.Lock()
	defer r.cmu.Unlock()
	if rev < r.checkedRev {
		return false
	}
	r.checkedRev = rev
	apply()
	if errText(outcome) != errText(r.claimErr) {
		close(r.claimCh)
		r.claimCh = make(chan struct{})
	}
	r.claimErr = outcome
	return true
}

// errText is err's message, "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Reclaim is the operator's explicit re-claim of the partition after the real cluster behind
// its cluster name was rebuilt (a new kube-system Namespace, so a new cluster ID): it replaces a
// claim held by cluster ID previous with this writer's Config.ClusterID, recording previous in
// previous_cluster_id, in one transaction conditional on the claim read. It is idempotent: a
// claim that already holds this cluster ID is returned unchanged (changed false), and a
// partition without a claim is claimed. A claim held by any ID other than previous is left
// alone and refused with a *ClaimConflictError, so a wrong or stale previous cannot take
// another cluster's partition. It returns the claim in force afterwards.
func (r *Registry) Reclaim(ctx context.Context, previous string) (claim *registryv1.PartitionClaim, changed bool, err error) {
	if r.clusterID == "" {
		return nil, false, errors.New("re-claim partition: Config.ClusterID: required")
	}
	key := r.origin.ClaimKey()
	resp, err := r.cli.Get(ctx, key)
	if err != nil {
		return nil, false, fmt.Errorf("re-claim partition %s: %w", r.origin, err)
	}
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	if len(resp.Kvs) > 0 {
		kv := resp.Kvs[0]
		old, err := decodeClaim(kv)
		if err != nil {
			return nil, false, fmt.Errorf("re-claim partition %s: %w", r.origin, err)
		}
		switch old.ClusterId {
		case r.clusterID:
			r.recordCheck(resp.Header.Revision, func() { r.setGuardLocked(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)) }, nil)
			return old, false, nil
		case previous:
		default:
			return old, false, fmt.Errorf("re-claim partition %s: held by cluster ID %q, not the previous cluster ID %q given: %w",
				r.origin, old.ClusterId, previous, &ClaimConflictError{Origin: r.origin, ClusterID: r.clusterID, Claim: old})
		}
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)
	} else {
		previous = ""
	}
	c := r.newClaim(previous)
	b, err := proto.Marshal(c)
	if err != nil {
		return nil, false, fmt.Errorf("re-claim partition %s: marshal: %w", r.origin, err)
	}
	tr, err := r.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return nil, false, fmt.Errorf("re-claim partition %s: %w", r.origin, err)
	}
	if !tr.Succeeded {
		return nil, false, fmt.Errorf("re-claim partition %s: the claim at %s changed while it was replaced; nothing written, run it again", r.origin, key)
	}
	r.log.Warn("registry: partition re-claimed for this cluster", "key", key, "cluster_id", r.clusterID, "previous_cluster_id", previous)
	r.recordCheck(tr.Header.Revision, func() { r.setGuardLocked(clientv3.Compare(clientv3.ModRevision(key), "=", tr.Header.Revision)) }, nil)
	return c, true, nil
}

// newClaim returns this writer's claim, replacing previous.
func (r *Registry) newClaim(previous string) *registryv1.PartitionClaim {
	return &registryv1.PartitionClaim{
		ClusterId: r.clusterID, ClaimTime: time.Now().UTC().Format(time.RFC3339Nano),
		ClaimedBy: r.claimedBy, PreviousClusterId: previous,
	}
}

// decodeClaim decodes a stored claim; one that does not unmarshal or names no cluster ID is an
// error naming its key and how to clear it.
func decodeClaim(kv *mvccpb.KeyValue) (*registryv1.PartitionClaim, error) {
	c := new(registryv1.PartitionClaim)
	err := proto.Unmarshal(kv.Value, c)
	if err == nil {
		err = ValidateClusterID("cluster_id", c.ClusterId)
	}
	if err != nil {
		return nil, fmt.Errorf("check partition claim: %s holds no valid PartitionClaim (%v); nothing is written into the partition until it is deleted (etcdctl del %s), then the cluster's registrar claims it again: %w", kv.Key, err, kv.Key, ErrClaimUnreadable)
	}
	return c, nil
}

// setGuardLocked records the compare that keeps this writer's writes valid (the claim as
// verified). Callers hold cmu.
func (r *Registry) setGuardLocked(cmp clientv3.Cmp) {
	r.guard = &cmp
	if r.conflict {
		r.log.Info("registry: partition claim is this cluster's again; writing", "key", r.origin.ClaimKey(), "cluster_id", r.clusterID)
	}
	r.conflict = false
	r.m.claimConflict.Set(0)
}

// clearGuard makes the next write verify the claim again.
func (r *Registry) clearGuard() {
	r.cmu.Lock()
	defer r.cmu.Unlock()
	r.guard = nil
}

// setConflictLocked refuses writes until a check finds the claim this cluster's again; it logs
// the conflict when it starts. Callers hold cmu.
func (r *Registry) setConflictLocked(err *ClaimConflictError) {
	r.guard = nil
	if !r.conflict {
		r.log.Error("registry: partition claimed by another cluster; writing nothing into it", "key", r.origin.ClaimKey(),
			"claim_cluster_id", err.Claim.GetClusterId(), "claim_time", err.Claim.GetClaimTime(), "claimed_by", err.Claim.GetClaimedBy(),
			"cluster_id", r.clusterID)
	}
	r.conflict = true
	r.m.claimConflict.Set(1)
}

// claimGuard returns the compare a write must carry: the verified claim, after verifying it
// (EnsureClaim) when it is not (first write, changed claim, conflict).
func (r *Registry) claimGuard(ctx context.Context) (clientv3.Cmp, error) {
	r.cmu.Lock()
	g := r.guard
	r.cmu.Unlock()
	if g != nil {
		return *g, nil
	}
	if _, err := r.EnsureClaim(ctx); err != nil {
		return clientv3.Cmp{}, err
	}
	r.cmu.Lock()
	defer r.cmu.Unlock()
	if r.guard == nil {
		return clientv3.Cmp{}, fmt.Errorf("check partition claim %s: changed while it was checked", r.origin)
	}
	return *r.guard, nil
}

// write commits ops (puts and deletes under the writer's prefix) atomically. Without a
// Config.ClusterID it commits them as they are. With one, the transaction also compares the
// partition claim with the one verified: when the claim changed, it is verified again and the
// write retried (at most three times); when another cluster holds it, the write is refused with
// a *ClaimConflictError and nothing is written.
func (r *Registry) write(ctx context.Context, ops ...clientv3.Op) error {
	if r.clusterID == "" {
		if len(ops) == 1 {
			_, err := r.cli.Do(ctx, ops[0])
			return err
		}
		_, err := r.cli.Txn(ctx).Then(ops...).Commit()
		return err
	}
	for range 3 {
		cmp, err := r.claimGuard(ctx)
		if err != nil {
			return err
		}
		resp, err := r.cli.Txn(ctx).If(cmp).Then(ops...).Commit()
		if err != nil {
			return err
		}
		if resp.Succeeded {
			return nil
		}
		r.clearGuard()
	}
	return fmt.Errorf("write under %s: the partition claim %s changed during three attempts in a row", r.origin.Prefix(), r.origin.ClaimKey())
}

// defaultClaimedBy names this process for a claim's claimed_by: its command and host name.
func defaultClaimedBy() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s on host %s", filepath.Base(os.Args[0]), host)
}
