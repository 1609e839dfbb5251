package registry

import (
	"encoding/base64"
	"fmt"
	"strings"
)

// Root is the prefix of every registry key. Readers list and watch everything under it.
const Root = "/aether/v1/regions/"

// Kind is the type of record a key holds, named by the key segment after the cluster.
type Kind string

// The record kinds and their key segments.
const (
	KindEndpoint Kind = "endpoints"
	KindExport   Kind = "exports"
	KindConfig   Kind = "config"
	// KindClaim is the partition claim, the single key .../clusters/<cluster>/claim (no
	// namespace or service): which real cluster owns the partition (see Registry.EnsureClaim).
	KindClaim Kind = "claim"
)

// Origin is the region and cluster a record belongs to, as read from its key path.
type Origin struct {
	Region  string
	Cluster string
}

// String returns "<region>/<cluster>".
func (o Origin) String() string { return o.Region + "/" + o.Cluster }

// Prefix returns the origin's own key prefix, /aether/v1/regions/<region>/clusters/<cluster>/.
func (o Origin) Prefix() string { return Root + o.Region + "/clusters/" + o.Cluster + "/" }

// Validate checks that region and cluster are usable key segments (see validName), returning an
// error naming the field and value otherwise.
func (o Origin) Validate() error {
	if err := validName(o.Region); err != nil {
		return fieldErr("region", o.Region, err.Error())
	}
	if err := validName(o.Cluster); err != nil {
		return fieldErr("cluster", o.Cluster, err.Error())
	}
	return nil
}

// EndpointKey returns .../endpoints/<ns>/<svc>/<podUID> under the origin's prefix.
func (o Origin) EndpointKey(namespace, service, podUID string) string {
	return o.Prefix() + string(KindEndpoint) + "/" + namespace + "/" + service + "/" + podUID
}

// ExportKey returns .../exports/<ns>/<svc> under the origin's prefix.
func (o Origin) ExportKey(namespace, service string) string {
	return o.Prefix() + string(KindExport) + "/" + namespace + "/" + service
}

// ClaimKey returns .../claim under the origin's prefix: the partition's PartitionClaim. It sits
// inside the prefix, so the cluster's own etcd user (SetupAuth) may write it.
func (o Origin) ClaimKey() string { return o.Prefix() + string(KindClaim) }

// ConfigKey returns .../config/<base64url(<ns>/<svc>)> under the origin's prefix. The encoding
// is RFC 4648 section 5 (URL and filename safe alphabet) without padding.
func (o Origin) ConfigKey(namespace, service string) string {
	return o.Prefix() + string(KindConfig) + "/" + base64.RawURLEncoding.EncodeToString([]byte(namespace+"/"+service))
}

// Key is a parsed registry key.
type Key struct {
	Origin Origin
	Kind   Kind
	// Namespace and Service are empty for the claim key.
	Namespace string
	Service   string
	// PodUID is set for endpoint keys only.
	PodUID string
}

// ParseKey splits a registry key into origin, kind, service and (for endpoints) pod UID; the
// claim key (.../clusters/<cluster>/claim) has origin and kind only. It returns an error naming
// the key when the key does not follow the layout or a segment is not a valid name.
func ParseKey(key string) (Key, error) {
	rest, ok := strings.CutPrefix(key, Root)
	if !ok {
		return Key{}, fmt.Errorf("parse key %q: not under %s", key, Root)
	}
	parts := strings.Split(rest, "/")
	if len(parts) == 4 && parts[1] == "clusters" && Kind(parts[3]) == KindClaim {
		k := Key{Origin: Origin{Region: parts[0], Cluster: parts[2]}, Kind: KindClaim}
		if err := k.Origin.Validate(); err != nil {
			return Key{}, fmt.Errorf("parse key %q: %w", key, err)
		}
		return k, nil
	}
	// <region> clusters <cluster> <kind> ...
	if len(parts) < 5 || parts[1] != "clusters" {
		return Key{}, fmt.Errorf("parse key %q: want %s<region>/clusters/<cluster>/<kind>/<rest>", key, Root)
	}
	k := Key{Origin: Origin{Region: parts[0], Cluster: parts[2]}, Kind: Kind(parts[3])}
	if err := k.Origin.Validate(); err != nil {
		return Key{}, fmt.Errorf("parse key %q: %w", key, err)
	}
	tail := parts[4:]
	switch k.Kind {
	case KindEndpoint:
		if len(tail) != 3 {
			return Key{}, fmt.Errorf("parse key %q: want endpoints/<ns>/<svc>/<pod uid>", key)
		}
		k.Namespace, k.Service, k.PodUID = tail[0], tail[1], tail[2]
		if err := validPodUID(k.PodUID); err != nil {
			return Key{}, fmt.Errorf("parse key %q: %w", key, err)
		}
	case KindExport:
		if len(tail) != 2 {
			return Key{}, fmt.Errorf("parse key %q: want exports/<ns>/<svc>", key)
		}
		k.Namespace, k.Service = tail[0], tail[1]
	case KindConfig:
		if len(tail) != 1 {
			return Key{}, fmt.Errorf("parse key %q: want config/<base64url(ns/svc)>", key)
		}
		raw, err := base64.RawURLEncoding.DecodeString(tail[0])
		if err != nil {
			return Key{}, fmt.Errorf("parse key %q: config segment is not unpadded base64url: %w", key, err)
		}
		ns, svc, ok := strings.Cut(string(raw), "/")
		if !ok {
			return Key{}, fmt.Errorf("parse key %q: config segment decodes to %q, want <ns>/<svc>", key, raw)
		}
		k.Namespace, k.Service = ns, svc
	default:
		return Key{}, fmt.Errorf("parse key %q: unknown kind %q", key, k.Kind)
	}
	if err := validServiceRef(k.Namespace, k.Service, "key"); err != nil {
		return Key{}, fmt.Errorf("parse key %q: %w", key, err)
	}
	return k, nil
}

// DefaultRegion is the region of a cluster's partition when none is configured (--region,
// AETHER_REGION): the agent and the registrar both use it, so both name the one partition
// regions/default/clusters/<cluster> the registrar claims.
const DefaultRegion = "default"
