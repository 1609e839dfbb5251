package registry

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
)

// Export validates m and writes it under .../exports/<ns>/<svc> of this writer's prefix, with no
// lease (export marks live until Unexport). Empty cluster_name and region are filled with the
// writer's origin (another value is refused with ErrOutsidePrefix); an empty create_time is
// set to now (UTC, RFC 3339 with nanoseconds). It returns a *ValidationError for an invalid
// mark and the etcd error when the write fails.
func (r *Registry) Export(ctx context.Context, m *registryv1.ExportMark) error {
	if err := r.checkOrigin("cluster_name", m.GetClusterName(), r.origin.Cluster); err != nil {
		return fmt.Errorf("export service: %w", err)
	}
	if err := r.checkOrigin("region", m.GetRegion(), r.origin.Region); err != nil {
		return fmt.Errorf("export service: %w", err)
	}
	m = proto.Clone(m).(*registryv1.ExportMark)
	m.ClusterName, m.Region = r.origin.Cluster, r.origin.Region
	if m.CreateTime == "" {
		m.CreateTime = time.Now().UTC().Format(time.RFC3339Nano)
	}
	if err := ValidateExport(m); err != nil {
		return fmt.Errorf("export service: %w", err)
	}
	if err := r.put(ctx, r.origin.ExportKey(m.Service.Namespace, m.Service.Name), m); err != nil {
		return fmt.Errorf("export service: %w", err)
	}
	return nil
}

// Unexport deletes this writer's export mark for namespace/name; a missing mark is not an error.
func (r *Registry) Unexport(ctx context.Context, namespace, name string) error {
	if err := validServiceRef(namespace, name, "service"); err != nil {
		return fmt.Errorf("unexport service: %w", err)
	}
	if err := r.del(ctx, r.origin.ExportKey(namespace, name)); err != nil {
		return fmt.Errorf("unexport service: %w", err)
	}
	return nil
}

// ListExports returns the clusterset-wide export view: every valid export mark under Root (all
// regions and clusters) in key order, with the revision it was read at.
func (r *Registry) ListExports(ctx context.Context) ([]Record[*registryv1.ExportMark], int64, error) {
	recs, rev, err := list(ctx, r, exportCodec)
	if err != nil {
		return nil, 0, fmt.Errorf("list exports: %w", err)
	}
	return recs, rev, nil
}

// WatchExports watches every export mark under Root: a Snapshot batch, then changes (see
// WatchEndpoints for resume and compaction behaviour).
func (r *Registry) WatchExports(ctx context.Context) <-chan Batch[*registryv1.ExportMark] {
	return watch(ctx, r, exportCodec)
}

// PutConfig validates c and writes it under .../config/<base64url(<ns>/<svc>)> of this writer's
// prefix, with no lease. Empty origin_cluster and origin_region are filled with the writer's
// origin (another value is refused with ErrOutsidePrefix); an empty export_time is set to now
// (UTC, RFC 3339 with nanoseconds). The writer keeps version increasing (the config-export
// controller reads its own records at start). It returns a *ValidationError naming the first bad
// field.
func (r *Registry) PutConfig(ctx context.Context, c *registryv1.ServiceConfigProjection) error {
	if err := r.checkOrigin("origin_cluster", c.GetOriginCluster(), r.origin.Cluster); err != nil {
		return fmt.Errorf("put config projection: %w", err)
	}
	if err := r.checkOrigin("origin_region", c.GetOriginRegion(), r.origin.Region); err != nil {
		return fmt.Errorf("put config projection: %w", err)
	}
	c = proto.Clone(c).(*registryv1.ServiceConfigProjection)
	c.OriginCluster, c.OriginRegion = r.origin.Cluster, r.origin.Region
	if c.ExportTime == "" {
		c.ExportTime = time.Now().UTC().Format(time.RFC3339Nano)
	}
	if err := ValidateConfig(c); err != nil {
		return fmt.Errorf("put config projection: %w", err)
	}
	if err := r.put(ctx, r.origin.ConfigKey(c.Service.Namespace, c.Service.Name), c); err != nil {
		return fmt.Errorf("put config projection: %w", err)
	}
	return nil
}

// DeleteConfig deletes this writer's config projection for namespace/name; a missing one is not
// an error.
func (r *Registry) DeleteConfig(ctx context.Context, namespace, name string) error {
	if err := validServiceRef(namespace, name, "service"); err != nil {
		return fmt.Errorf("delete config projection: %w", err)
	}
	if err := r.del(ctx, r.origin.ConfigKey(namespace, name)); err != nil {
		return fmt.Errorf("delete config projection: %w", err)
	}
	return nil
}

// ListConfigs returns every valid config projection under Root in key order, with the revision
// it was read at.
func (r *Registry) ListConfigs(ctx context.Context) ([]Record[*registryv1.ServiceConfigProjection], int64, error) {
	recs, rev, err := list(ctx, r, configCodec)
	if err != nil {
		return nil, 0, fmt.Errorf("list config projections: %w", err)
	}
	return recs, rev, nil
}

// WatchConfigs watches every config projection under Root: a Snapshot batch, then changes (see
// WatchEndpoints for resume and compaction behaviour).
func (r *Registry) WatchConfigs(ctx context.Context) <-chan Batch[*registryv1.ServiceConfigProjection] {
	return watch(ctx, r, configCodec)
}
