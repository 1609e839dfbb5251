package dnsd

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
)

// TestMain doubles as the Go resolver client of TestPrivilegedClientsThroughDNAT: with
// DNSD_GO_LOOKUP set, the test binary (started inside the pod namespace, where ip netns exec
// mounts the pod's resolv.conf) resolves that name with Go's resolver, prints the addresses
// one per line and exits; with DNSD_GO_SRV ("<service> <proto> <name>") it looks up the SRV
// records of _<service>._<proto>.<name> and prints "<target> <port>" per record. With
// resolvConfServeEnv set it is the resolver of
// TestPrivilegedForwardsPastBadResolvConfLines (serveFromResolvConf).
func TestMain(m *testing.M) {
	if path := os.Getenv(resolvConfServeEnv); path != "" {
		os.Exit(serveFromResolvConf(path))
	}
	if name := os.Getenv("DNSD_GO_LOOKUP"); name != "" {
		addrs, err := net.DefaultResolver.LookupHost(context.Background(), name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for _, a := range addrs {
			fmt.Println(a)
		}
		os.Exit(0)
	}
	if q := strings.Fields(os.Getenv("DNSD_GO_SRV")); len(q) == 3 {
		_, srvs, err := net.DefaultResolver.LookupSRV(context.Background(), q[0], q[1], q[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for _, s := range srvs {
			fmt.Println(s.Target, s.Port)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
