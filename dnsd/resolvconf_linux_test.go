//go:build linux

package dnsd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestPrivilegedForwardsPastBadResolvConfLines: a resolver whose resolv.conf starts with lines
// glibc skips ("nameserver 10.0.0.10:53", a host name) starts, warns about each of them, and
// forwards names outside the mesh to the good nameserver on the next line, over UDP and TCP.
// Everything runs in a fresh network namespace (the upstream must listen on port 53, which a
// resolv.conf cannot change): the upstream stub on 127.0.0.1:53, the resolver (this test binary
// again, so its forwarding sockets are opened in the namespace too) on 127.0.0.1:18054, and the
// queries.
func TestPrivilegedForwardsPastBadResolvConfLines(t *testing.T) {
	testenv.RequireRoot(t)
	ns := testenv.NewNetns(t)
	var pc net.PacketConn
	var l net.Listener
	if err := ns.Do(func() (err error) {
		pc, l, err = listenBoth("127.0.0.1:53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	up := startStubOn(t, pc, l, answerA(1))

	conf := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(conf, []byte("search svc.cluster.local\nnameserver 10.0.0.10:53\nnameserver kube-dns\nnameserver 127.0.0.1\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := ns.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), resolvConfServeEnv+"="+conf)
	stderr := &testenv.Buffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed once the process is reaped, waitErr set
	var waitErr error
	defer func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	ready := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- line == "ready\n"
		_, _ = io.Copy(io.Discard, stdout)
		waitErr = cmd.Wait()
		close(exited)
	}()
	select {
	case ok := <-ready:
		if !ok {
			<-exited
			t.Fatalf("the resolver did not start (%v):\n%s", waitErr, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the resolver was not ready after 60 s:\n%s", stderr.String())
	}

	for _, netw := range []string{"udp", "tcp"} {
		var resp *dns.Msg
		err := ns.Do(func() (err error) {
			c := &dns.Client{Net: netw, Timeout: 10 * time.Second}
			resp, _, err = c.Exchange(query("www.example.org.", dns.TypeA, nil), resolvConfServeAddr)
			return err
		})
		if err != nil {
			t.Fatalf("%s query: %v\n%s", netw, err, stderr.String())
		}
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "192.0.2.1" {
			t.Fatalf("%s answer = %v, want the upstream's 192.0.2.1", netw, resp)
		}
	}
	if n := up.queries.Load(); n != 2 {
		t.Errorf("the upstream on 127.0.0.1:53 got %d queries, want 2 (one per transport)", n)
	}

	stdin.Close()
	<-exited
	if waitErr != nil {
		t.Fatalf("resolver exit: %v\n%s", waitErr, stderr.String())
	}
	var warned []string
	for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var rec struct {
			Level, File, Value string
			Line               int
		}
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Level == "WARN" && rec.File == conf {
			warned = append(warned, fmt.Sprintf("%d %s", rec.Line, rec.Value))
		}
	}
	if strings.Join(warned, ",") != "2 10.0.0.10:53,3 kube-dns" {
		t.Errorf("warnings about skipped lines %q, want lines 2 and 3 named; log:\n%s", warned, stderr.String())
	}
}
