package registry

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/protobuf/proto"
)

// DefaultLeaseTTL is the endpoint lease TTL when Config.LeaseTTL is zero: a dead writer's
// endpoints disappear at most this long after its last keepalive. The writer renews the lease
// every TTL/3 (etcd clientv3 KeepAlive).
const DefaultLeaseTTL = 30 * time.Second

// listPageSize is how many keys one range request of a list fetches; pages are read at one
// revision, so a list is a consistent snapshot.
const listPageSize = 5000

// reconnectMaxDelay caps the etcd client's reconnect backoff and bounds one connection attempt.
const reconnectMaxDelay = 3 * time.Second

// Config configures a Registry.
type Config struct {
	// Endpoints are the etcd client URLs (https:// when TLS is used). Required by New.
	Endpoints []string
	// TLS, when set, is the client TLS configuration (CA and client certificate) for an external
	// etcd; see TLSFiles for building it from PEM files.
	TLS *tls.Config
	// Username and Password authenticate to etcd when its auth is on (see SetupAuth). With TLS
	// client-certificate authentication etcd takes the user from the certificate's CN instead.
	// With auth on, a writer with a ClusterID writes only as its cluster's own user
	// (UserName(origin)); anything else is a UserError (checked with the partition claim).
	Username, Password string
	// AllowForeignUser lets a writer whose etcd user is not its cluster's own write anyway, with
	// a warning (--registry-insecure).
	AllowForeignUser bool
	// DialTimeout bounds the first connection (default 5 s).
	DialTimeout time.Duration
	// Region and Cluster are this writer's origin: every write goes under
	// /aether/v1/regions/<Region>/clusters/<Cluster>/. Both must be RFC 1123 DNS labels.
	Region, Cluster string
	// ClusterID, when set, identifies the real cluster this writer belongs to (the UID of its
	// kube-system Namespace) and turns the partition claim on: every write into the partition
	// is conditional on its claim (Origin.ClaimKey) naming this cluster ID, or, for a
	// non-claimer, on there being no claim; a partition claimed by another cluster ID is never
	// written (see EnsureClaim). Empty: no claim is checked (single-cluster tests and tools).
	ClusterID string
	// Claimer makes this writer claim its partition when nobody has (the registrar); otherwise
	// it only checks the claim (the agent).
	Claimer bool
	// ClaimedBy names the process in a claim it writes, for operators (default: the command and
	// host name).
	ClaimedBy string
	// LeaseTTL is the endpoint lease TTL (default DefaultLeaseTTL; etcd raises values below its
	// minimum, 1.5 election timeouts, to that minimum). Whole seconds; rounded up.
	LeaseTTL time.Duration
	// Logger receives the registry's logs (default slog.Default()).
	Logger *slog.Logger
	// Metrics, when set, registers the registry's Prometheus counters
	// (aether_registry_bad_records_total, aether_registry_lease_lost_total,
	// aether_registry_watch_relists_total, aether_registry_claim_watch_restarts_total) and the
	// aether_registry_partition_claim_conflict gauge.
	Metrics prometheus.Registerer
}

// TLSFiles builds a client TLS configuration from PEM files: the client certificate and key and
// the CA that signed etcd's serving certificate. With all three empty it returns nil, nil
// (plaintext, Config.TLS unset). It returns an error naming the file that could not be used.
func TLSFiles(certFile, keyFile, caFile string) (*tls.Config, error) {
	if certFile == "" && keyFile == "" && caFile == "" {
		return nil, nil
	}
	info := transport.TLSInfo{CertFile: certFile, KeyFile: keyFile, TrustedCAFile: caFile}
	c, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load etcd client TLS (cert %s, key %s, ca %s): %w", certFile, keyFile, caFile, err)
	}
	return c, nil
}

// Registry reads the whole registry and writes under its own origin's prefix. It is safe for
// concurrent use.
type Registry struct {
	cli     *clientv3.Client
	ownsCli bool
	origin  Origin
	ttl     int64 // seconds
	log     *slog.Logger
	m       *metrics

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// wmu serialises endpoint writes and lease changes, so a re-registration under a new lease
	// never races a Register or Deregister.
	wmu     sync.Mutex
	closed  bool
	lease   clientv3.LeaseID
	desired map[string][]byte // endpoint key -> value this writer keeps registered
	leaseCh chan struct{}     // closed and replaced whenever the lease changes (tests, Lease)

	// What etcd answers for the lease (keepalive.go, KeepAliveStatus), under their own mutex
	// so that a reader never waits for an endpoint write holding wmu.
	kmu        sync.Mutex
	kaLease    clientv3.LeaseID
	kaAnswered time.Time     // last answer for kaLease (grant or keepalive)
	kaPeriod   time.Duration // longest expected time between two answers
	kaMissed   time.Time     // end of the last stretch longer than kaPeriod without an answer

	// The partition claim (claim.go).
	clusterID string
	claimer   bool
	claimedBy string
	cmu       sync.Mutex
	guard     *clientv3.Cmp // the verified claim every write compares; nil: verify first
	conflict  bool          // the last check found another cluster's claim
	// checkedRev is the etcd revision the last recorded claim check read at (recordCheck).
	checkedRev int64
	// claimErr is the outcome of that check (ClaimStatus); claimCh is closed and replaced
	// whenever it changes.
	claimErr error
	claimCh  chan struct{}
	// afterClaimRead, when set (tests), runs in EnsureClaim after the claim was read.
	afterClaimRead func()

	// The writer's etcd identity (identity.go): checked once, with the claim.
	user             string
	allowForeignUser bool
	umu              sync.Mutex
	userChecked      bool
	userErr          error
	warnedAuthOff    bool
}

// New connects to etcd and returns a Registry for cfg's origin. It returns an error when the
// origin is invalid, no endpoint is given or the client cannot be created. It does not wait for
// etcd to answer: operations fail with their context instead.
func New(cfg Config) (*Registry, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("create registry: no etcd endpoints (Config.Endpoints)")
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		TLS:         cfg.TLS,
		Username:    cfg.Username,
		Password:    cfg.Password,
		DialTimeout: cfg.DialTimeout,
		// Keepalive pings detect a dead member quickly, so the client moves to another one.
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		// gRPC's default reconnect backoff grows to 120 s: after a long partition a client
		// would stay away that long after the registry is back (its lease and watch with it).
		// Capped at reconnectMaxDelay, a writer re-registers within seconds of the registry's
		// return, inside the readers' deletion hold (agent registryView).
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMaxDelay},
			MinConnectTimeout: reconnectMaxDelay,
		})},
		// clientv3's own zap log is dropped: the registry logs what matters (lost leases,
		// interrupted watches, failed writes) through cfg.Logger.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("create registry: connect etcd %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	r, err := NewWithClient(cli, cfg)
	if err != nil {
		cli.Close()
		return nil, err
	}
	r.ownsCli = true
	return r, nil
}

// NewWithClient returns a Registry that uses an existing etcd client (cfg.Endpoints, TLS and
// credentials are ignored). Close does not close cli.
func NewWithClient(cli *clientv3.Client, cfg Config) (*Registry, error) {
	o := Origin{Region: cfg.Region, Cluster: cfg.Cluster}
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("create registry: %w", err)
	}
	ttl := cfg.LeaseTTL
	if ttl == 0 {
		ttl = DefaultLeaseTTL
	}
	if ttl < 0 {
		return nil, fmt.Errorf("create registry: lease TTL %v: must be positive", ttl)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("create registry: %w", err)
	}
	if cfg.Claimer && cfg.ClusterID == "" {
		return nil, errors.New("create registry: ClusterID: required with Claimer")
	}
	if cfg.ClusterID != "" {
		if err := ValidateClusterID("ClusterID", cfg.ClusterID); err != nil {
			return nil, fmt.Errorf("create registry: %w", err)
		}
	}
	claimedBy := cfg.ClaimedBy
	if claimedBy == "" {
		claimedBy = defaultClaimedBy()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Registry{
		cli: cli, origin: o, ttl: int64((ttl + time.Second - 1) / time.Second),
		log: log.With("region", o.Region, "cluster", o.Cluster), m: m,
		ctx: ctx, cancel: cancel,
		desired: map[string][]byte{}, leaseCh: make(chan struct{}),
		clusterID: cfg.ClusterID, claimer: cfg.Claimer, claimedBy: claimedBy,
		claimErr: ErrClaimNotChecked, claimCh: make(chan struct{}),
		user: presentedUser(cfg.Username, cfg.TLS), allowForeignUser: cfg.AllowForeignUser,
	}, nil
}

// Origin returns the writer's own region and cluster.
func (r *Registry) Origin() Origin { return r.origin }

// Client returns the underlying etcd client.
func (r *Registry) Client() *clientv3.Client { return r.cli }

// Close stops lease keepalives and watches started by this Registry and closes the etcd client
// when New created it. It does not revoke the lease: the endpoints stay until the lease TTL
// passes (a restarting agent re-registers them under a new lease without a gap). Use
// RevokeEndpoints to remove them at once.
func (r *Registry) Close() error {
	r.cancel()
	// Under wmu, so no lease keeper starts (wg.Add) once Wait runs.
	r.wmu.Lock()
	r.closed = true
	r.wmu.Unlock()
	r.wg.Wait()
	if r.ownsCli {
		return r.cli.Close()
	}
	return nil
}

// ErrClosed is returned (wrapped) for an endpoint write after Close.
var ErrClosed = errors.New("registry closed")

// ErrOutsidePrefix is returned (wrapped) for a write whose key or record origin is not this
// writer's own.
var ErrOutsidePrefix = errors.New("write outside own prefix")

// checkOwn refuses a key outside the writer's own prefix.
func (r *Registry) checkOwn(key string) error {
	if !strings.HasPrefix(key, r.origin.Prefix()) {
		return fmt.Errorf("key %q is not under %s: %w", key, r.origin.Prefix(), ErrOutsidePrefix)
	}
	return nil
}

// checkOrigin refuses a record that names another origin; an empty field means "mine".
func (r *Registry) checkOrigin(field, got, own string) error {
	if got != "" && got != own {
		return fmt.Errorf("%s %q is not this writer's %q: %w", field, got, own, ErrOutsidePrefix)
	}
	return nil
}

// put writes one record under the writer's prefix with the given options.
func (r *Registry) put(ctx context.Context, key string, v proto.Message, opts ...clientv3.OpOption) error {
	if err := r.checkOwn(key); err != nil {
		return err
	}
	b, err := proto.Marshal(v)
	if err != nil {
		return fmt.Errorf("marshal %q: %w", key, err)
	}
	if err := r.write(ctx, clientv3.OpPut(key, string(b), opts...)); err != nil {
		return fmt.Errorf("put %q: %w", key, err)
	}
	return nil
}

// del deletes one key under the writer's prefix; deleting a missing key is not an error.
func (r *Registry) del(ctx context.Context, key string) error {
	if err := r.checkOwn(key); err != nil {
		return err
	}
	if err := r.write(ctx, clientv3.OpDelete(key)); err != nil {
		return fmt.Errorf("delete %q: %w", key, err)
	}
	return nil
}

// list reads every record of c's kind under Root at one revision, in key order, skipping (and
// logging and counting) bad ones. It returns the records and the revision they were read at.
func list[T proto.Message](ctx context.Context, r *Registry, c codec[T]) ([]Record[T], int64, error) {
	var out []Record[T]
	rev, err := r.scan(ctx, func(key string, value []byte, modRev int64) {
		if rec, ok, _ := decodeOrSkip(r, c, key, value, modRev); ok {
			out = append(out, rec)
		}
	})
	return out, rev, err
}

// scan calls fn for every key under Root, paging at one revision, and returns that revision.
func (r *Registry) scan(ctx context.Context, fn func(key string, value []byte, modRev int64)) (int64, error) {
	end := clientv3.GetPrefixRangeEnd(Root)
	from := Root
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPageSize)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := r.cli.Get(ctx, from, opts...)
		if err != nil {
			return 0, fmt.Errorf("list %s: %w", Root, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			fn(string(kv.Key), kv.Value, kv.ModRevision)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// decodeOrSkip decodes one stored record; a bad one is logged with its key, counted and skipped
// (ok false), as is a record of another kind (silently). bad describes a skipped record of c's
// kind whose key parses (its value does not decode or validate); it is nil otherwise.
func decodeOrSkip[T proto.Message](r *Registry, c codec[T], key string, value []byte, modRev int64) (rec Record[T], ok bool, bad *InvalidRecord[T]) {
	rec, err := c.decode(key, value, modRev)
	if err == nil {
		return rec, true, nil
	}
	var be *badRecordError
	if errors.As(err, &be) {
		// Every reader that skips a record counts it under its own kind: a bad key under Root is
		// seen (and counted) by the endpoint, export and config readers alike.
		r.m.badRecords.WithLabelValues(string(c.kind), be.reason).Inc()
		r.log.Warn("registry: skipping bad record", "key", key, "reader", string(c.kind), "reason", be.reason, "err", err)
		if be.reason != badKey {
			k, _ := ParseKey(key)
			bad = &InvalidRecord[T]{Key: key, Origin: k.Origin, Namespace: k.Namespace, Service: k.Service,
				ModRevision: modRev, Err: err}
			if v, ok := be.value.(T); ok {
				bad.Value = v
			}
		}
	}
	var zero Record[T]
	return zero, false, bad
}
