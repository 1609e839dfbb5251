package dnsd

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
)

// TestMain doubles as the Go resolver client of TestPrivilegedClientsThroughDNAT: with
// DNSD_GO_LOOKUP set, the test binary (started inside the pod namespace, where ip netns exec
// mounts the pod's resolv.conf) resolves that name with Go's resolver, prints the addresses
// one per line and exits. With resolvConfServeEnv set it is the resolver of
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
	os.Exit(m.Run())
}
