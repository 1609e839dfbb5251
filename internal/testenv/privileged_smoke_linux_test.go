//go:build linux

package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// vethPair joins two namespaces with a veth pair, addresses a/24 and b/24 on the ends.
func vethPair(t *testing.T, na, nb *Netns, a, b string) {
	t.Helper()
	ha, err := na.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Close()
	nbh, err := netns.GetFromPath(nb.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer nbh.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth-a"}, PeerName: "veth-b", PeerNamespace: netlink.NsFd(int(nbh))}
	if err := ha.LinkAdd(veth); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	hb, err := nb.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	for _, side := range []struct {
		h    *netlink.Handle
		name string
		addr string
	}{{ha, "veth-a", a}, {hb, "veth-b", b}} {
		l, err := side.h.LinkByName(side.name)
		if err != nil {
			t.Fatalf("find %s: %v", side.name, err)
		}
		addr, _ := netlink.ParseAddr(side.addr + "/24")
		if err := side.h.AddrAdd(l, addr); err != nil {
			t.Fatalf("address %s: %v", side.name, err)
		}
		if err := side.h.LinkSetUp(l); err != nil {
			t.Fatalf("up %s: %v", side.name, err)
		}
	}
}

// listenIn opens a TCP listener inside ns that echoes one line back per connection.
func listenIn(t *testing.T, ns *Netns, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	if err := ns.Do(func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatalf("listen %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return l
}

// echoFrom dials addr from inside ns and checks the echo; it returns the dial or echo error.
func echoFrom(ns *Netns, addr string) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != "ping\n" {
			return fmt.Errorf("echo = %q, want ping", buf)
		}
		return nil
	})
}

// TestPrivilegedVethTraffic joins two fresh namespaces with a veth pair and passes TCP traffic.
func TestPrivilegedVethTraffic(t *testing.T) {
	RequireRoot(t)
	a, b := NewNetns(t), NewNetns(t)
	vethPair(t, a, b, "192.0.2.1", "192.0.2.2")
	listenIn(t, b, "192.0.2.2:7777")
	if err := echoFrom(a, "192.0.2.2:7777"); err != nil {
		t.Fatalf("veth traffic a -> b: %v", err)
	}
	// The listener lives only in b: a's own address does not answer on that port.
	if err := echoFrom(a, "192.0.2.1:7777"); err == nil {
		t.Fatal("a reached 192.0.2.1:7777, but nothing listens there in a")
	}
}

// TestPrivilegedCNIBridgeHostLocal runs the reference bridge + host-local plugins through libcni
// into a fresh namespace and checks that it gets the address the result names.
func TestPrivilegedCNIBridgeHostLocal(t *testing.T) {
	RequireRoot(t)
	tl := RequireTools(t, ToolCNIPlugins)
	pod := NewNetns(t)
	dir := t.TempDir()
	// The bridge lives in the test's root namespace: use a host namespace of our own so the
	// machine's own links are never touched.
	host := NewNetns(t)
	conf := fmt.Sprintf(`{
  "cniVersion": "1.1.0",
  "name": "smoke",
  "plugins": [{
    "type": "bridge", "bridge": "aetsmoke0", "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": "10.244.7.0/24"}]]}
  }]
}`, filepath.Join(dir, "ipam"))
	list, err := libcni.ConfListFromBytes([]byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfig([]string{tl.CNIBinDir}, nil)
	rt := &libcni.RuntimeConf{ContainerID: "smoke-ctr", NetNS: pod.Path, IfName: "eth0"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var res *current.Result
	// Plugins run in the host namespace of whoever execs them: exec them from `host`.
	err = host.Do(func() error {
		r, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(r)
		return err
	})
	if err != nil {
		t.Fatalf("CNI ADD: %v", err)
	}
	if len(res.IPs) != 1 || !res.IPs[0].Address.IP.Equal(net.ParseIP("10.244.7.2")) {
		b, _ := json.Marshal(res)
		t.Fatalf("ADD result = %s, want one IP 10.244.7.2", b)
	}
	h, err := pod.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatalf("eth0 in pod namespace: %v", err)
	}
	addrs, err := h.AddrList(eth0, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != res.IPs[0].Address.String() {
		t.Fatalf("eth0 addresses = %v, want %s", addrs, res.IPs[0].Address.String())
	}
	// The gateway (bridge in `host`) answers through the new link.
	listenIn(t, host, "10.244.7.1:7000")
	if err := echoFrom(pod, "10.244.7.1:7000"); err != nil {
		t.Fatalf("pod -> bridge gateway: %v", err)
	}
	if err := host.Do(func() error { return cni.DelNetworkList(ctx, list, rt) }); err != nil {
		t.Fatalf("CNI DEL: %v", err)
	}
	if _, err := h.LinkByName("eth0"); err == nil {
		t.Fatal("eth0 still present after CNI DEL")
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "ipam", "smoke")); len(ents) > 2 {
		t.Errorf("host-local state left after DEL: %v", ents)
	}
}

// TestPrivilegedNftablesInNetns applies an nftables rule set inside a fresh namespace and shows
// that it takes effect there: TCP to one port is rejected while another still connects.
func TestPrivilegedNftablesInNetns(t *testing.T) {
	RequireRoot(t)
	ns := NewNetns(t)
	listenIn(t, ns, "127.0.0.1:7001")
	listenIn(t, ns, "127.0.0.1:7002")
	h, err := netns.GetFromPath(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		t.Fatal(err)
	}
	tbl := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "aether_smoke"})
	policy := nftables.ChainPolicyAccept
	ch := conn.AddChain(&nftables.Chain{Name: "output", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &policy})
	conn.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(7001)},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	}})
	if err := conn.Flush(); err != nil {
		t.Fatalf("apply nftables rule set: %v", err)
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil || len(tables) != 1 || tables[0].Name != "aether_smoke" {
		t.Fatalf("tables in namespace = %v, %v; want aether_smoke", tables, err)
	}
	if err := echoFrom(ns, "127.0.0.1:7001"); err == nil {
		t.Fatal("TCP to 7001 connected; the reject rule did not apply")
	}
	if err := echoFrom(ns, "127.0.0.1:7002"); err != nil {
		t.Fatalf("TCP to 7002: %v", err)
	}
	// The machine's own namespace has no such table.
	root, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	rt, _ := root.ListTablesOfFamily(nftables.TableFamilyINet)
	for _, x := range rt {
		if x.Name == "aether_smoke" {
			t.Fatal("aether_smoke table leaked into the root namespace")
		}
	}
}

// TestPrivilegedForwarder: a connection accepted inside a namespace reaches an echo server on the
// root loopback through the Forwarder; Close cuts the established connection and stops
// accepting.
func TestPrivilegedForwarder(t *testing.T) {
	RequireRoot(t)
	ns := NewNetns(t) // lo is up
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	f := &Forwarder{}
	if err := f.Listen(ns, "127.0.0.1:7000", echo.Addr().String()); err != nil {
		t.Fatal(err)
	}
	c, err := ns.Dial("127.0.0.1:7000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := EchoOnce(c, "through the forwarder\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("read %d bytes after Close, want the connection cut", n)
	}
	if c2, err := ns.Dial("127.0.0.1:7000"); err == nil {
		c2.Close()
		t.Error("dial after Close succeeded, want refused")
	}
	if err := f.Listen(ns, "127.0.0.1:7001", echo.Addr().String()); err == nil {
		t.Error("Listen after Close succeeded, want an error")
	}
}

// TestPrivilegedSweepNetns: a namespace left by a test process that is gone is deleted; one of a
// live process is kept.
func TestPrivilegedSweepNetns(t *testing.T) {
	RequireRoot(t)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("aet-%d-5eed0001", gone.Process.Pid)
	live := fmt.Sprintf("aet-1-5eed%04x", os.Getpid()&0xffff) // pid 1 always runs
	for _, name := range []string{dead, live} {
		err := onLockedThread(func() error {
			h, err := netns.NewNamed(name)
			if err == nil {
				h.Close()
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netns.DeleteNamed(name) })
	}
	if err := SweepNetns(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, dead)); !os.IsNotExist(err) {
		t.Errorf("%s (process gone) after sweep: stat err = %v, want not exist", dead, err)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, live)); err != nil {
		t.Errorf("%s (pid 1 runs) after sweep: %v, want kept", live, err)
	}
	n := NewNetns(t)
	if !netnsName.MatchString(n.Name) || !strings.HasPrefix(n.Name, fmt.Sprintf("aet-%d-", os.Getpid())) {
		t.Errorf("NewNetns name %q, want aet-%d-<hex>", n.Name, os.Getpid())
	}
}
