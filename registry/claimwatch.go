package registry

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultClaimSafetyInterval is WatchClaim's safety re-read interval when none is given: the
// claim is read again this often although the watch reports every change, in case a watch
// missed one (it should not).
const DefaultClaimSafetyInterval = 5 * time.Minute

// claimWatchBackoff bounds the wait before WatchClaim reads and watches again after the watch
// or the read failed: it starts at the first value and doubles up to the second.
var claimWatchBackoff = [2]time.Duration{100 * time.Millisecond, 5 * time.Second}

// claimReadTimeout bounds each of WatchClaim's reads of the claim, so that an unreachable
// registry is logged and retried rather than waited for, and events are not held up behind a
// safety re-read.
const claimReadTimeout = 10 * time.Second

// ErrClaimNotChecked is what ClaimStatus reports before the first claim check was recorded.
var ErrClaimNotChecked = errors.New("registry partition claim not checked yet")

// ClaimStatus returns the outcome of the newest claim check this writer recorded (EnsureClaim,
// a write's re-check, Reclaim, or a change WatchClaim saw): nil when this writer may write into
// its partition (the claim names its cluster ID, or nobody for a non-claimer); a
// *ClaimConflictError (errors.Is ErrPartitionClaimed) while another cluster ID holds it; an
// ErrClaimUnreadable error naming the key while the key holds no valid claim; ErrClaimNotChecked
// before the first check. A check etcd did not answer records nothing. changed is closed when
// the outcome changes (a new error text counts as a change); call ClaimStatus again then.
func (r *Registry) ClaimStatus() (changed <-chan struct{}, err error) {
	r.cmu.Lock()
	defer r.cmu.Unlock()
	return r.claimCh, r.claimErr
}

// WatchClaim keeps the writer's claim state (ClaimStatus, and the compare every write carries)
// current until ctx ends or the Registry is closed, then returns nil. It reads the claim once
// (EnsureClaim: a claimer claims an unclaimed partition) and then watches the claim key from the
// revision after that read, so a claim changed by another cluster (a re-claim) or by an
// operator is recorded as soon as etcd reports it, with no read per interval: an idle writer
// costs the registry one watch and no range request. When the watch fails (no leader, the
// member lost) or its revision was compacted, it reads and watches again, after a backoff of
// 100 ms doubling to 5 s (at once after a compaction). Every safety interval (default
// DefaultClaimSafetyInterval when safety <= 0) it reads the claim again while the watch goes
// on. Each read is bounded by 10 s. Outcomes are recorded as EnsureClaim records them: one
// that is older (by etcd revision) than the newest recorded never replaces it. It returns an
// error at once when the writer has no Config.ClusterID.
func (r *Registry) WatchClaim(ctx context.Context, safety time.Duration) error {
	if r.clusterID == "" {
		return errors.New("watch partition claim: Config.ClusterID: required")
	}
	if safety <= 0 {
		safety = DefaultClaimSafetyInterval
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.ctx, cancel)()
	key := r.origin.ClaimKey()
	backoff := claimWatchBackoff[0]
	wait := func() bool {
		ok := sleep(ctx, backoff)
		backoff = min(backoff*2, claimWatchBackoff[1])
		return ok
	}
	failing := false
	for ctx.Err() == nil {
		rctx, rcancel := context.WithTimeout(ctx, claimReadTimeout)
		_, rev, err := r.ensureClaim(rctx)
		rcancel()
		if rev == 0 { // etcd did not answer (or ctx ended)
			if ctx.Err() != nil {
				return nil
			}
			if !failing {
				r.log.Warn("registry: reading the partition claim failed; retrying", "key", key, "err", err, "retry_in", backoff)
			}
			failing = true
			if !wait() {
				return nil
			}
			continue
		}
		failing = false
		reason, healthy := r.followClaim(ctx, rev, safety)
		if ctx.Err() != nil {
			return nil
		}
		r.m.claimWatchRestarts.WithLabelValues(reason).Inc()
		if healthy {
			backoff = claimWatchBackoff[0]
		}
		if reason == claimRestartCompacted {
			continue // the read is the recovery; nothing to wait for
		}
		if !wait() {
			return nil
		}
	}
	return nil
}

// The reasons WatchClaim reads and watches again (label reason of
// aether_registry_claim_watch_restarts_total).
const (
	claimRestartCompacted = "compacted"
	claimRestartError     = "error"
)

// followClaim watches the claim key from rev+1 and records every change until the watch ends,
// reading the claim again every safety interval meanwhile. It returns why the watch ended
// (claimRestartCompacted: rev+1 was compacted; claimRestartError: the watch failed or closed)
// and whether a response arrived.
func (r *Registry) followClaim(ctx context.Context, rev int64, safety time.Duration) (reason string, healthy bool) {
	key := r.origin.ClaimKey()
	// WithRequireLeader: a member cut off from its cluster's leader ends the watch instead of
	// keeping it silently, so it is re-created on a member that hears changes.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := r.cli.Watch(wctx, key, clientv3.WithRev(rev+1))
	t := time.NewTicker(safety)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return claimRestartError, healthy
		case <-t.C:
			rctx, rcancel := context.WithTimeout(ctx, claimReadTimeout)
			_, err := r.EnsureClaim(rctx)
			rcancel()
			if err != nil && !errors.Is(err, ErrPartitionClaimed) && !errors.Is(err, ErrClaimUnreadable) {
				r.log.Debug("registry: safety re-read of the partition claim failed; the watch goes on", "key", key, "err", err)
			}
		case resp, ok := <-wch:
			if !ok {
				return claimRestartError, healthy
			}
			if resp.CompactRevision != 0 {
				r.log.Info("registry: the partition claim's watch fell behind a compaction; reading it again", "key", key,
					"revision", rev, "compact_revision", resp.CompactRevision)
				return claimRestartCompacted, healthy
			}
			if err := resp.Err(); err != nil {
				if ctx.Err() == nil {
					r.log.Warn("registry: the partition claim's watch was interrupted; reading it again", "key", key, "err", err)
				}
				return claimRestartError, healthy
			}
			healthy = true
			for _, ev := range resp.Events {
				r.recordClaimEvent(ctx, ev)
				rev = max(rev, ev.Kv.ModRevision)
			}
		}
	}
}

// recordClaimEvent records the claim an event of the claim key shows, as of the event's
// revision. A deleted claim is re-created by a claimer (EnsureClaim) and, for a non-claimer,
// means the partition may be written until a registrar claims it.
func (r *Registry) recordClaimEvent(ctx context.Context, ev *clientv3.Event) {
	if ev.Type == clientv3.EventTypeDelete {
		if r.claimer {
			rctx, rcancel := context.WithTimeout(ctx, claimReadTimeout)
			defer rcancel()
			_, _ = r.EnsureClaim(rctx) // its outcome is recorded; an etcd error waits for the next event or read
			return
		}
		key := string(ev.Kv.Key)
		r.recordCheck(ev.Kv.ModRevision, func() { r.setGuardLocked(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)) }, nil)
		return
	}
	_, record, err := r.claimOutcome(ev.Kv)
	r.recordCheck(ev.Kv.ModRevision, record, err)
}
