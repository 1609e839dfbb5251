package dnsd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// skippedLine is one warning of ReadResolvConf: the file, line number and value it names.
type skippedLine struct {
	File  string `json:"file"`
	Line  int    `json:"line"`
	Value string `json:"value"`
}

// TestReadResolvConf: resolv.conf content seen on nodes (zone ids, options, comments, search
// lists) gives usable upstreams; a nameserver line glibc's res_init would not use (ip:port, a
// host name, a bracketed or zoned IPv4 address, no value) is skipped with one warning naming the
// file, the line and the value, and the other lines are used; only a file left with no usable
// nameserver is an error, naming the file. Every file is real, read from disk.
func TestReadResolvConf(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		want       string        // upstreams joined by ","; "" for an error
		warns      []skippedLine // File filled in by the test
	}{
		{name: "kubelet's", conf: "search default.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\nnameserver fd00::10\nnameserver 10.0.0.1\noptions ndots:5\n",
			want: "10.96.0.10:53,[fd00::10]:53"},
		{name: "zone id and options", conf: "# generated\noptions ndots:5 timeout:1 attempts:3 rotate edns0\nsearch a.svc.cluster.local svc.cluster.local\nnameserver fe80::1%eth0\nnameserver 10.96.0.10 # trailing\n",
			want: "[fe80::1%eth0]:53,10.96.0.10:53"},
		{name: "tabs, CRLF and a domain line", conf: "domain example.org\r\nnameserver\t10.0.0.10\r\n\n", want: "10.0.0.10:53"},
		{name: "IPv4-mapped", conf: "nameserver ::ffff:10.96.0.10\n", want: "[::ffff:10.96.0.10]:53"},
		{name: "port in the address, then a good one", conf: "nameserver 10.0.0.10:53\nnameserver 10.96.0.10\n",
			want: "10.96.0.10:53", warns: []skippedLine{{Line: 1, Value: "10.0.0.10:53"}}},
		{name: "every kind of bad line among good ones", conf: "search svc.cluster.local\nnameserver kube-dns\nnameserver 10.96.0.10\nnameserver [fd00::10]\nnameserver\nnameserver 10.0.0.10%eth0\n; comment\nnameserver fd00::10\nnameserver 010.0.0.1\n",
			want:  "10.96.0.10:53,[fd00::10]:53",
			warns: []skippedLine{{Line: 2, Value: "kube-dns"}, {Line: 4, Value: "[fd00::10]"}, {Line: 5, Value: ""}, {Line: 6, Value: "10.0.0.10%eth0"}, {Line: 9, Value: "010.0.0.1"}}},
		{name: "only the resolver itself", conf: "nameserver 10.0.0.1\n"},
		{name: "empty", conf: ""},
		{name: "only a host name", conf: "nameserver kube-dns\n", warns: []skippedLine{{Line: 1, Value: "kube-dns"}}},
		{name: "only ip:port", conf: "options ndots:5\nnameserver 10.0.0.10:5353\n", warns: []skippedLine{{Line: 2, Value: "10.0.0.10:5353"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "resolv.conf")
			if err := os.WriteFile(p, []byte(tc.conf), 0o644); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			ups, err := ReadResolvConf(p, slog.New(slog.NewJSONHandler(&logs, nil)), "10.0.0.1:53")
			var warns []skippedLine
			for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				if l == "" {
					continue
				}
				var w skippedLine
				if err := json.Unmarshal([]byte(l), &w); err != nil || !strings.Contains(l, `"level":"WARN"`) {
					t.Fatalf("log line %q: %v, want a warning", l, err)
				}
				warns = append(warns, w)
			}
			if len(warns) != len(tc.warns) {
				t.Fatalf("warnings %+v, want %+v", warns, tc.warns)
			}
			for i, w := range tc.warns {
				if w.File = p; warns[i] != w {
					t.Errorf("warning %d = %+v, want %+v", i, warns[i], w)
				}
			}
			if tc.want == "" {
				if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "no usable nameserver") {
					t.Fatalf("upstreams %v, error %v; want an error naming %s", ups, err, p)
				}
				return
			}
			if err != nil || strings.Join(ups, ",") != tc.want {
				t.Fatalf("upstreams %v, %v; want %s", ups, err, tc.want)
			}
			if _, err := NewForwarder(ups, ForwarderOptions{}); err != nil {
				t.Fatalf("NewForwarder(%v) = %v", ups, err)
			}
		})
	}
	if _, err := ReadResolvConf(filepath.Join(t.TempDir(), "missing"), nil); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing file: %v, want an error naming it", err)
	}
}

// resolvConfServeEnv names the resolv.conf serveFromResolvConf reads.
const resolvConfServeEnv = "DNSD_RESOLV_CONF_SERVE"

// resolvConfServeAddr is where serveFromResolvConf's resolver listens, inside the test's own
// network namespace.
const resolvConfServeAddr = "127.0.0.1:18054"

// serveFromResolvConf is the resolver process of TestPrivilegedForwardsPastBadResolvConfLines,
// started inside the test's namespace: it builds its upstreams as the agent does
// (ReadResolvConf with the resolver's own address excluded, then NewForwarder), serves on
// resolvConfServeAddr, logs JSON to stderr, prints "ready" and serves until stdin closes. It
// returns the exit status.
func serveFromResolvConf(path string) int {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	fail := func(err error) int {
		log.Error("serve from resolv.conf", "err", err)
		return 1
	}
	ups, err := ReadResolvConf(path, log, resolvConfServeAddr)
	if err != nil {
		return fail(err)
	}
	fwd, err := NewForwarder(ups, ForwarderOptions{})
	if err != nil {
		return fail(err)
	}
	res, err := NewResolver(fwd, ResolverOptions{Logger: log})
	if err != nil {
		return fail(err)
	}
	if err := res.Update(testMesh()); err != nil {
		return fail(err)
	}
	srv := NewServer(res, ServerConfig{Addr: resolvConfServeAddr, Logger: log})
	if err := srv.Start(context.Background()); err != nil {
		return fail(err)
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Shutdown(context.Background())
	return 0
}

// TestClusterDomainFromResolvConf: the kubelet's search list names the cluster domain (the entry
// X with svc.X beside it), whatever the case, trailing dots and node domains after it; the last
// search or domain line wins, as in glibc; a list without such a pair names none; an unreadable
// file is an error naming it.
func TestClusterDomainFromResolvConf(t *testing.T) {
	dir := t.TempDir()
	for i, tc := range []struct{ conf, want string }{
		{conf: "nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n", want: "cluster.local"},
		{conf: "search kube-system.svc.Corp.Example. svc.Corp.Example. Corp.Example. ec2.internal\nnameserver 10.96.0.10\n", want: "corp.example"},
		{conf: "search a.svc.cluster.local svc.cluster.local cluster.local\nsearch ec2.internal\n", want: ""},
		{conf: "search ec2.internal\ndomain x.svc.cluster.local\nsearch a.svc.k8s.test svc.k8s.test k8s.test\n", want: "k8s.test"},
		{conf: "search svc.example.com example.org\n", want: ""},
		{conf: "nameserver 10.0.0.2\n", want: ""},
		{conf: "search\tsvc.cluster.local\tcluster.local\r\n", want: "cluster.local"},
	} {
		p := filepath.Join(dir, fmt.Sprintf("resolv-%d.conf", i))
		if err := os.WriteFile(p, []byte(tc.conf), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := ClusterDomainFromResolvConf(p); err != nil || got != tc.want {
			t.Errorf("%q: ClusterDomainFromResolvConf = %q, %v; want %q", tc.conf, got, err, tc.want)
		}
	}
	missing := filepath.Join(dir, "missing.conf")
	if _, err := ClusterDomainFromResolvConf(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: err = %v, want one naming %s", err, missing)
	}
}
