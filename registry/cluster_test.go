package registry

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/internal/testenv"
)

// etcdCluster is a three-member etcd cluster of real etcd processes (the cached etcd binary,
// hack/tools.sh) on loopback ports, whose members a test stops and starts.
type etcdCluster struct {
	t       testing.TB
	bin     string
	members []*etcdMember
}

type etcdMember struct {
	name, dir, clientURL string
	args                 []string
	cmd                  *exec.Cmd
	exited               chan struct{}
}

func startEtcdCluster(t testing.TB) *etcdCluster {
	t.Helper()
	tools := testenv.RequireTools(t, testenv.ToolEtcd)
	c := &etcdCluster{t: t, bin: tools.Etcd}
	root := t.TempDir()
	var initial []string
	peers := make([]string, 3)
	for i := range 3 {
		peers[i] = fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))
		initial = append(initial, fmt.Sprintf("m%d=%s", i, peers[i]))
	}
	token := fmt.Sprintf("aether-test-%d", time.Now().UnixNano())
	for i := range 3 {
		m := &etcdMember{name: fmt.Sprintf("m%d", i), dir: filepath.Join(root, fmt.Sprintf("m%d", i)),
			clientURL: fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))}
		m.args = []string{
			"--name", m.name, "--data-dir", filepath.Join(m.dir, "data"),
			"--listen-client-urls", m.clientURL, "--advertise-client-urls", m.clientURL,
			"--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", token, "--log-level", "warn",
		}
		c.members = append(c.members, m)
	}
	t.Cleanup(func() {
		for i := range c.members {
			c.stop(i, syscall.SIGKILL)
		}
	})
	for i := range c.members {
		c.start(i)
	}
	c.waitLeader()
	return c
}

func (c *etcdCluster) endpoints() []string {
	var out []string
	for _, m := range c.members {
		out = append(out, m.clientURL)
	}
	return out
}

// start runs member i (again: a restarted member rejoins from its data directory).
func (c *etcdCluster) start(i int) {
	c.t.Helper()
	m := c.members[i]
	if err := os.MkdirAll(m.dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	logf, err := os.OpenFile(filepath.Join(m.dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	m.cmd = exec.Command(c.bin, m.args...)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	if err := m.cmd.Start(); err != nil {
		c.t.Fatalf("start etcd member %s: %v", m.name, err)
	}
	m.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); logf.Close(); close(done) }(m.cmd, m.exited)
}

// stop ends member i with sig (SIGTERM: graceful; SIGKILL: crash) and waits for it to exit.
func (c *etcdCluster) stop(i int, sig syscall.Signal) {
	m := c.members[i]
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Signal(sig)
	<-m.exited
	m.cmd = nil
}

// leader returns the index of the current leader, or -1.
func (c *etcdCluster) leader() int {
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.endpoints(), DialTimeout: 2 * time.Second})
	if err != nil {
		return -1
	}
	defer cli.Close()
	for i, m := range c.members {
		if m.cmd == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := cli.Status(ctx, m.clientURL)
		cancel()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i
		}
	}
	return -1
}

func (c *etcdCluster) waitLeader() int {
	c.t.Helper()
	var l int
	testenv.Eventually(c.t, converge, "etcd leader", func() error {
		if l = c.leader(); l < 0 {
			return fmt.Errorf("no leader among running members")
		}
		return nil
	})
	return l
}

// memberKeys reads the registry keys straight from one member's local store (serializable).
func memberKeys(t testing.TB, url string) ([]string, int64) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, Root, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithSerializable())
	if err != nil {
		t.Fatalf("read member %s: %v", url, err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys, resp.Header.Revision
}

// With one of three members stopped (the leader), writes and watches continue; with two
// stopped, writers get errors and nothing is corrupted; when the members return everything
// resumes: the writer's endpoints are all registered, the watcher converges, every member holds
// the same keys.
func TestThreeMemberClusterQuorumLoss(t *testing.T) {
	c := startEtcdCluster(t)
	ctx := ctxT(t, 4*converge)
	w := newTestRegistry(t, c.endpoints(), "eu", "alpha", func(cfg *Config) { cfg.LeaseTTL = 3 * time.Second })
	reader := newTestRegistry(t, c.endpoints(), "eu", "reader", nil)
	v := startViewer(t, reader.WatchEndpoints(ctx))
	key := func(uid string) string { return w.Origin().EndpointKey("shop", "cart", uid) }
	register := func(uid string) error {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		return w.RegisterEndpoint(rctx, testEndpoint("shop", "cart", uid, "10.0.0.1"))
	}

	if err := register("p1"); err != nil {
		t.Fatal(err)
	}
	v.waitKeys(t, key("p1"))

	// One member down (the leader): writes and watches continue.
	first := c.waitLeader()
	c.stop(first, syscall.SIGTERM)
	testenv.Eventually(t, converge, "register with one member down", func() error { return register("p2") })
	v.waitKeys(t, key("p1"), key("p2"))

	// Two down: no quorum. Writes fail with an error.
	second := (first + 1) % 3
	c.stop(second, syscall.SIGKILL)
	if err := register("p3"); err == nil {
		t.Fatal("register without quorum succeeded")
	}
	// Stay without quorum longer than the lease TTL, so the writer's keepalives fail.
	time.Sleep(4 * time.Second)

	// Members return: everything resumes.
	c.start(first)
	c.start(second)
	c.waitLeader()
	testenv.Eventually(t, converge, "register after quorum is back", func() error { return register("p3") })
	v.waitKeys(t, key("p1"), key("p2"), key("p3"))
	recs, _, err := reader.ListEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("after recovery: %d endpoints, want 3", len(recs))
	}
	// The endpoints stay alive (their lease is kept alive) well past the TTL.
	time.Sleep(4 * time.Second)
	v.waitKeys(t, key("p1"), key("p2"), key("p3"))
	// Every member converges to the same keys at the same revision.
	testenv.Eventually(t, converge, "members agree", func() error {
		var ref []string
		var refRev int64
		for i, m := range c.members {
			keys, rev := memberKeys(t, m.clientURL)
			if i == 0 {
				ref, refRev = keys, rev
				continue
			}
			if !slices.Equal(keys, ref) || rev != refRev {
				return fmt.Errorf("member %s has %q at revision %d, member m0 %q at %d", m.name, keys, rev, ref, refRev)
			}
		}
		return nil
	})
}
