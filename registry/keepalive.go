package registry

import (
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// keepAliveSlack is how much longer than a third of the lease TTL the writer waits for the next
// answer to its lease keepalive before it counts the keepalive as missed. clientv3's KeepAlive
// sends the next keepalive a third of the TTL after an answer, checking every 500 ms
// (clientv3 lease.go, sendKeepAliveLoop); the rest is the round trip.
const keepAliveSlack = time.Second

// KeepAliveStatus says how etcd answers the keepalives of this writer's endpoint lease: a reader
// of the same Registry can use them as its round trips to the registry instead of reads of its
// own (agent registryView). In etcd 3.6 a keepalive is answered by the leader
// (a follower forwards it), which first checks that it is still the leader
// (EtcdServer.LeaseRenew, ensureLeadership): with a linearizable read when its raft loop has
// not ticked for three heartbeat ticks, else from its own state. A leader cut off from the
// quorum steps down within about one election timeout (raft CheckQuorum), so after that its
// keepalives fail; an answer is weaker evidence than a linearizable read, a missed answer is
// as good.
type KeepAliveStatus struct {
	// Lease is the current endpoint lease; 0 while the writer holds none (nothing registered
	// yet, or RevokeEndpoints): then no keepalive runs and Answered, Period and Missing are
	// zero.
	Lease clientv3.LeaseID
	// Answered is when etcd last answered for the lease: its grant, or a keepalive.
	Answered time.Time
	// Period is the longest expected time between two answers: a third of the TTL etcd granted
	// plus keepAliveSlack (1 s). An answer later than that is a missed keepalive.
	Period time.Duration
	// Missing is true while the current lease's answer is overdue (now is later than Answered
	// plus Period): cut off from etcd, no leader, or a lost lease not replaced yet.
	Missing bool
	// Missed is when a keepalive was last missed: now while Missing, else the end of the last
	// overdue stretch (the answer, or the grant of a lease replacing a lost one, that ended
	// it); zero when none was ever missed.
	Missed time.Time
}

// KeepAliveStatus returns the state of the endpoint lease's keepalives at now. It never waits
// for etcd or for an endpoint write in progress.
func (r *Registry) KeepAliveStatus(now time.Time) KeepAliveStatus {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	s := KeepAliveStatus{Lease: r.kaLease, Answered: r.kaAnswered, Period: r.kaPeriod, Missed: r.kaMissed}
	if s.Lease != 0 && now.Sub(s.Answered) > s.Period {
		s.Missing, s.Missed = true, now
	}
	return s
}

// noteGrant records that etcd granted lease id, with a TTL of ttl seconds, and that it is now
// the writer's lease; at is when the grant and the re-registration under it were answered.
// replacesLost says it replaces a lease that was lost: the stretch since the old lease's last
// answer counts like a keepalive gap.
func (r *Registry) noteGrant(id clientv3.LeaseID, at time.Time, ttl int64, replacesLost bool) {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	if !replacesLost {
		r.kaAnswered = time.Time{}
	}
	r.kaLease = id
	r.answeredLocked(at, ttl)
}

// noteAnswer records etcd's answer at at to a keepalive of lease id with a TTL of ttl seconds;
// an answer for a lease that is no longer the writer's is ignored.
func (r *Registry) noteAnswer(id clientv3.LeaseID, at time.Time, ttl int64) {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	if id == r.kaLease {
		r.answeredLocked(at, ttl)
	}
}

// answeredLocked records an answer at at; one later than the period after the previous answer
// ends a missed stretch. Callers hold kmu.
func (r *Registry) answeredLocked(at time.Time, ttl int64) {
	if !r.kaAnswered.IsZero() && at.Sub(r.kaAnswered) > r.kaPeriod {
		r.kaMissed = at
	}
	r.kaAnswered = at
	r.kaPeriod = time.Duration(ttl)*time.Second/3 + keepAliveSlack
}

// noteRevoked records that the writer holds no lease any more: it expects no keepalive answer.
func (r *Registry) noteRevoked() {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	r.kaLease, r.kaAnswered, r.kaPeriod = 0, time.Time{}, 0
}
