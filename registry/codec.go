package registry

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
)

// Record is one decoded registry record with its key, its origin (from the key path, never from
// the value) and the etcd revision that last modified it.
type Record[T proto.Message] struct {
	Key         string
	Origin      Origin
	ModRevision int64
	Value       T
}

// codec decodes one kind of record: unmarshal, stamp the key's origin and service into the value,
// validate.
type codec[T proto.Message] struct {
	kind     Kind
	new      func() T
	stamp    func(T, Key)
	validate func(T) error
	// maxBytes, when set, refuses a stored value longer than that before it is unmarshalled, so
	// an oversized record costs a reader no more than its bytes (0: no cap beyond etcd's own).
	maxBytes int
}

var endpointCodec = codec[*registryv1.ServiceEndpoint]{
	kind: KindEndpoint,
	new:  func() *registryv1.ServiceEndpoint { return new(registryv1.ServiceEndpoint) },
	stamp: func(v *registryv1.ServiceEndpoint, k Key) {
		v.Region, v.ClusterName = k.Origin.Region, k.Origin.Cluster
		v.Service = &registryv1.ServiceRef{Namespace: k.Namespace, Name: k.Service}
		if v.Kubernetes == nil {
			v.Kubernetes = &registryv1.KubernetesMetadata{}
		}
		v.Kubernetes.PodUid = k.PodUID
	},
	validate: ValidateEndpoint,
}

var exportCodec = codec[*registryv1.ExportMark]{
	kind: KindExport,
	new:  func() *registryv1.ExportMark { return new(registryv1.ExportMark) },
	stamp: func(v *registryv1.ExportMark, k Key) {
		v.Region, v.ClusterName = k.Origin.Region, k.Origin.Cluster
		v.Service = &registryv1.ServiceRef{Namespace: k.Namespace, Name: k.Service}
	},
	validate: ValidateExport,
	// Two maps of at most MaxExportedMetadataBytes each, ports and names: far below this.
	maxBytes: 4 * MaxExportedMetadataBytes,
}

var configCodec = codec[*registryv1.ServiceConfigProjection]{
	kind: KindConfig,
	new:  func() *registryv1.ServiceConfigProjection { return new(registryv1.ServiceConfigProjection) },
	stamp: func(v *registryv1.ServiceConfigProjection, k Key) {
		v.OriginRegion, v.OriginCluster = k.Origin.Region, k.Origin.Cluster
		v.Service = &registryv1.ServiceRef{Namespace: k.Namespace, Name: k.Service}
	},
	validate: ValidateConfig,
	maxBytes: MaxConfigBytes,
}

// Reasons a stored record is skipped (label "reason" of aether_registry_bad_records_total).
const (
	badKey   = "key"
	badValue = "value"
	badField = "invalid"
)

// errOtherKind marks a well-formed key of another kind: not an error, just not this reader's.
var errOtherKind = errors.New("other kind")

// badRecordError is a stored record a reader skips.
type badRecordError struct {
	reason string
	err    error
	// value is the unmarshalled value of a record that fails validation (reason badField).
	value proto.Message
}

func (e *badRecordError) Error() string { return e.err.Error() }
func (e *badRecordError) Unwrap() error { return e.err }

// decode turns a stored key and value into a Record. It returns errOtherKind for a valid key of
// another kind and a *badRecordError for an unparsable key, a value that does not unmarshal or a
// record that fails validation.
func (c codec[T]) decode(key string, value []byte, modRev int64) (Record[T], error) {
	k, err := ParseKey(key)
	if err != nil {
		return Record[T]{}, &badRecordError{reason: badKey, err: err}
	}
	if k.Kind != c.kind {
		return Record[T]{}, errOtherKind
	}
	if c.maxBytes > 0 && len(value) > c.maxBytes {
		return Record[T]{}, &badRecordError{reason: badValue, err: fmt.Errorf("decode %s %q: %d bytes: want at most %d", c.kind, key, len(value), c.maxBytes)}
	}
	v := c.new()
	if err := proto.Unmarshal(value, v); err != nil {
		return Record[T]{}, &badRecordError{reason: badValue, err: fmt.Errorf("decode %s %q: %w", c.kind, key, err)}
	}
	c.stamp(v, k)
	if err := c.validate(v); err != nil {
		return Record[T]{}, &badRecordError{reason: badField, err: fmt.Errorf("decode %s %q: %w", c.kind, key, err), value: v}
	}
	return Record[T]{Key: key, Origin: k.Origin, ModRevision: modRev, Value: v}, nil
}

// DecodeEndpoint, DecodeExport and DecodeConfig turn a key and a value as the store holds them
// (the value in protobuf wire format) into a Record exactly as a watch or a list does: the key's
// origin and service are stamped into the value, which is then validated. They return an error
// naming the key for a key of another kind or one that does not parse, a value that does not
// unmarshal and a record that fails validation. The agent reloads the records it persisted
// (its last-known registry state) through them, so they pass the checks of live records.
func DecodeEndpoint(key string, value []byte) (Record[*registryv1.ServiceEndpoint], error) {
	return decodeKind(endpointCodec, key, value)
}

// DecodeExport is DecodeEndpoint for export marks.
func DecodeExport(key string, value []byte) (Record[*registryv1.ExportMark], error) {
	return decodeKind(exportCodec, key, value)
}

// DecodeConfig is DecodeEndpoint for config projections.
func DecodeConfig(key string, value []byte) (Record[*registryv1.ServiceConfigProjection], error) {
	return decodeKind(configCodec, key, value)
}

func decodeKind[T proto.Message](c codec[T], key string, value []byte) (Record[T], error) {
	rec, err := c.decode(key, value, 0)
	if errors.Is(err, errOtherKind) {
		return rec, fmt.Errorf("decode %s %q: a key of another kind", c.kind, key)
	}
	return rec, err
}

// metrics are the registry's Prometheus collectors.
type metrics struct {
	badRecords *prometheus.CounterVec
	leaseLost  prometheus.Counter
	relists    prometheus.Counter
	// claimConflict is 1 while this writer's partition is claimed by another cluster.
	claimConflict prometheus.Gauge
	// claimWatchRestarts counts WatchClaim's re-reads after its watch ended, by reason.
	claimWatchRestarts *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		badRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aether_registry_bad_records_total",
			Help: "Registry records skipped by readers because their key or value is malformed or invalid, by kind and reason (key, value, invalid).",
		}, []string{"kind", "reason"}),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aether_registry_lease_lost_total",
			Help: "Times this writer lost its endpoint lease and re-registered its endpoints under a new one.",
		}),
		relists: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aether_registry_watch_relists_total",
			Help: "Times a watch fell behind a compaction and re-listed the store.",
		}),
		claimConflict: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "aether_registry_partition_claim_conflict",
			Help: "1 while this writer's registry partition (its region and cluster name) is claimed by another real cluster (another kube-system Namespace UID), so it writes nothing; 0 otherwise.",
		}),
		claimWatchRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aether_registry_claim_watch_restarts_total",
			Help: "Times the watch of this writer's partition claim ended and the claim was read and watched again, by reason (compacted: its revision was compacted; error: the watch failed).",
		}, []string{"reason"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.badRecords, err = register(reg, m.badRecords); err != nil {
		return nil, err
	}
	if m.leaseLost, err = register(reg, m.leaseLost); err != nil {
		return nil, err
	}
	if m.relists, err = register(reg, m.relists); err != nil {
		return nil, err
	}
	if m.claimConflict, err = register(reg, m.claimConflict); err != nil {
		return nil, err
	}
	if m.claimWatchRestarts, err = register(reg, m.claimWatchRestarts); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c with reg, or returns the collector already registered under its name (so
// several Registry values in one process share their counters).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if ex, ok := are.ExistingCollector.(C); ok {
				return ex, nil
			}
		}
		return c, fmt.Errorf("register metrics: %w", err)
	}
	return c, nil
}
