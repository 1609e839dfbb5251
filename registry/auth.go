package registry

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ClusterUser is one cluster's etcd identity for SetupAuth.
type ClusterUser struct {
	Origin Origin
	// Password of the user; empty means no password: the cluster authenticates with a TLS client
	// certificate whose CN is UserName(Origin) (etcd --client-cert-auth).
	Password string
}

// UserName returns the etcd user (and role) name of a cluster: "aether.<region>.<cluster>".
// Regions and clusters are DNS labels, so the name is unambiguous.
func UserName(o Origin) string { return "aether." + o.Region + "." + o.Cluster }

// SetupAuth makes origins unforgeable on a shared etcd (DESIGN.md, registry): it creates (or
// updates) the root user with rootPassword and, for every cluster, a role that may read the whole
// Root and read and write only the cluster's own prefix, and a user with that role; then it
// enables etcd authentication. cli must be able to manage users: unauthenticated while auth is
// still off, or root once it is on. It is idempotent; a role's other permissions are revoked.
// It returns the first etcd error, wrapped with the user or role it concerned.
//
// etcd checks every Put, Delete and Txn against the caller's role (etcd auth guide, "Permission
// check"), so a cluster's credentials cannot write another cluster's keys even straight against
// etcd. Leases need no permission to grant or keep alive; revoking one needs write permission on
// every key attached to it.
func SetupAuth(ctx context.Context, cli *clientv3.Client, rootPassword string, users []ClusterUser) error {
	if rootPassword == "" {
		return fmt.Errorf("set up etcd auth: root password: required")
	}
	if err := ensureUser(ctx, cli, "root", rootPassword); err != nil {
		return err
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		return fmt.Errorf("set up etcd auth: grant root role: %w", err)
	}
	for _, u := range users {
		if err := u.Origin.Validate(); err != nil {
			return fmt.Errorf("set up etcd auth: %w", err)
		}
		name := UserName(u.Origin)
		if err := ensureRole(ctx, cli, name, u.Origin.Prefix()); err != nil {
			return err
		}
		if err := ensureUser(ctx, cli, name, u.Password); err != nil {
			return err
		}
		if _, err := cli.UserGrantRole(ctx, name, name); err != nil {
			return fmt.Errorf("set up etcd auth: grant role %s to user %s: %w", name, name, err)
		}
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("set up etcd auth: enable auth: %w", err)
	}
	return nil
}

func ensureUser(ctx context.Context, cli *clientv3.Client, name, password string) error {
	_, err := cli.UserAddWithOptions(ctx, name, password, &clientv3.UserAddOptions{NoPassword: password == ""})
	if errors.Is(err, rpctypes.ErrUserAlreadyExist) {
		if password == "" {
			return nil
		}
		_, err = cli.UserChangePassword(ctx, name, password)
	}
	if err != nil {
		return fmt.Errorf("set up etcd auth: user %s: %w", name, err)
	}
	return nil
}

// ensureRole makes role name hold exactly READ on Root and READWRITE on prefix.
func ensureRole(ctx context.Context, cli *clientv3.Client, name, prefix string) error {
	if _, err := cli.RoleAdd(ctx, name); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return fmt.Errorf("set up etcd auth: role %s: %w", name, err)
	}
	want := map[string]clientv3.PermissionType{
		Root:   clientv3.PermissionType(clientv3.PermRead),
		prefix: clientv3.PermissionType(clientv3.PermReadWrite),
	}
	got, err := cli.RoleGet(ctx, name)
	if err != nil {
		return fmt.Errorf("set up etcd auth: role %s: %w", name, err)
	}
	for _, p := range got.Perm {
		key := string(p.Key)
		if t, ok := want[key]; ok && string(p.RangeEnd) == clientv3.GetPrefixRangeEnd(key) && clientv3.PermissionType(p.PermType) == t {
			continue
		}
		if _, err := cli.RoleRevokePermission(ctx, name, key, string(p.RangeEnd)); err != nil {
			return fmt.Errorf("set up etcd auth: role %s: revoke stale permission on %q: %w", name, key, err)
		}
	}
	for key, t := range want {
		if _, err := cli.RoleGrantPermission(ctx, name, key, clientv3.GetPrefixRangeEnd(key), t); err != nil {
			return fmt.Errorf("set up etcd auth: role %s: grant %v on %q: %w", name, t, key, err)
		}
	}
	return nil
}
