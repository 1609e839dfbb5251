package images

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"

	"github.com/aethermesh/aether/internal/testenv"
)

// unpack extracts img's file system into a fresh directory (GNU tar, owners and modes kept)
// and returns it.
func unpack(t *testing.T, img v1.Image) string {
	t.Helper()
	root := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	cmd := exec.Command("tar", "-x", "-p", "--numeric-owner", "-C", root)
	cmd.Stdin = rc
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("unpack image: %v: %s", err, out)
	}
	return root
}

// inImage returns a command that runs args in the image unpacked at root (chroot), with the
// image's default PATH and env added.
func inImage(root string, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	cmd.Env = append([]string{defaultPath}, env...)
	return cmd
}

// runIn runs args in the image at root with stdin and returns stdout and stderr together,
// failing the test when the command fails.
func runIn(t *testing.T, root string, env []string, stdin string, args ...string) string {
	t.Helper()
	cmd := inImage(root, env, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s (in the image): %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestPrivilegedAgentImageRuns proves the agent image's Debian closure complete: in the
// unpacked image (chroot) nft, iptables in both backends (the alternatives pointing to nft),
// nsenter, aether-agent and aether-cni run; then, as the agent does, nsenter enters a fresh
// network namespace and loads capture's dual-stack rule sets (capture/testdata: the matches and
// targets the agent uses) with iptables-legacy-restore, iptables-nft-restore, ip6tables' and
// nft -f, and reads them back.
func TestPrivilegedAgentImageRuns(t *testing.T) {
	testenv.RequireRoot(t)
	root := unpack(t, builtImages(t)[AgentImage])
	for _, c := range []struct {
		args  []string
		env   []string
		stdin string
		want  string
	}{
		{args: []string{"/usr/sbin/nft", "--version"}, want: "nftables v1."},
		// iptables and ip6tables are the alternatives' links.
		{args: []string{"/usr/sbin/iptables", "--version"}, want: "(nf_tables)"},
		{args: []string{"/usr/sbin/ip6tables", "--version"}, want: "(nf_tables)"},
		{args: []string{"/usr/sbin/iptables-legacy", "--version"}, want: "(legacy)"},
		{args: []string{"/usr/sbin/ip6tables-legacy", "--version"}, want: "(legacy)"},
		{args: []string{"/usr/bin/nsenter", "--version"}, want: "util-linux"},
		{args: []string{"/usr/local/bin/aether-agent", "--help"}, want: "-cni-plugin-binary"},
		{args: []string{"/opt/aether/bin/aether-cni"}, env: []string{"CNI_COMMAND=VERSION"}, stdin: `{"cniVersion":"1.0.0"}`, want: `"supportedVersions"`},
	} {
		if out := runIn(t, root, c.env, c.stdin, c.args...); !strings.Contains(out, c.want) {
			t.Errorf("%s: %q, want %q in it", strings.Join(c.args, " "), out, c.want)
		}
	}

	n := testenv.NewNetns(t)
	netns := filepath.Join(root, "run", "netns", "test")
	if err := os.MkdirAll(filepath.Dir(netns), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(netns, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(n.Path, netns, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(netns, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", netns, err)
		}
	})
	ipt, err := os.ReadFile(filepath.Join(repoRoot(t), "capture", "testdata", "dual-stack.iptables"))
	if err != nil {
		t.Fatal(err)
	}
	v4, v6, ok := strings.Cut(string(ipt), "# ip6tables-restore --noflush")
	if !ok {
		t.Fatal("capture/testdata/dual-stack.iptables: no ip6tables section")
	}
	// The DaemonSet's XTABLES_LOCKFILE: iptables-legacy locks /run/xtables.lock otherwise.
	// The tools by name, found through the image's PATH, as capture runs them.
	env := []string{"XTABLES_LOCKFILE=/tmp/xtables.lock"}
	enter := []string{"/usr/bin/nsenter", "--net=/run/netns/test", "--"}
	for _, mode := range []string{"legacy", "nft"} {
		for fam, rules := range map[string]string{"iptables": v4, "ip6tables": v6} {
			runIn(t, root, env, rules, append(enter, fam+"-"+mode+"-restore", "--noflush")...)
			// -t: without /proc (not mounted here) -save finds no tables by itself.
			out := runIn(t, root, env, "", append(enter, fam+"-"+mode+"-save", "-t", "nat")...)
			if !strings.Contains(out, "aether:out-redirect") || !strings.Contains(out, "REDIRECT --to-ports 15001") {
				t.Errorf("%s-%s-save -t nat after the restore:\n%s\nwant capture's redirect rule", fam, mode, out)
			}
		}
	}
	nft, err := os.ReadFile(filepath.Join(repoRoot(t), "capture", "testdata", "dual-stack.nft"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "tmp", "rules.nft"), nft, 0o644); err != nil {
		t.Fatal(err)
	}
	runIn(t, root, nil, "", append(enter, "nft", "-f", "/tmp/rules.nft")...)
	if out := runIn(t, root, nil, "", append(enter, "nft", "list", "table", "inet", "aether")...); !strings.Contains(out, "aether:out-redirect") {
		t.Errorf("nft list table inet aether:\n%s\nwant capture's redirect rule", out)
	}
}

// TestPrivilegedEnvoyImageRuns: in the unpacked Envoy image the wheel's Envoy runs (glibc and
// the libraries it links are the closure's), and the entrypoint (dash, coreutils' sleep) waits
// for the bootstrap the agent writes, then execs Envoy with its arguments.
func TestPrivilegedEnvoyImageRuns(t *testing.T) {
	testenv.RequireRoot(t)
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	version := "/" + tools.Versions["ENVOY_VERSION"] + "/"
	root := unpack(t, builtImages(t)[EnvoyImage])
	if out := runIn(t, root, nil, "", "/usr/local/bin/envoy", "--version"); !strings.Contains(out, version) {
		t.Errorf("envoy --version: %q, want %q in it", out, version)
	}

	boot := "/var/lib/aether/envoy/bootstrap.json"
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(boot)), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := inImage(root, nil, "/usr/local/bin/aether-envoy-entrypoint", "-c", boot, "--version")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { <-ctx.Done(); _ = cmd.Process.Kill() }()
	sc := bufio.NewScanner(stderr)
	waiting := false
	for !waiting && sc.Scan() {
		waiting = strings.Contains(sc.Text(), "waiting for the agent to write "+boot)
	}
	if !waiting {
		t.Fatalf("the entrypoint never said it waits for %s (stderr ended: %v)", boot, sc.Err())
	}
	if err := os.WriteFile(filepath.Join(root, boot), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = bufio.NewReader(stderr).WriteTo(new(bytes.Buffer)) }()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("entrypoint -c %s --version: %v (stdout %q)", boot, err, stdout.String())
	}
	if !strings.Contains(stdout.String(), version) {
		t.Errorf("entrypoint, once the bootstrap was there: %q, want Envoy's version %q", stdout.String(), version)
	}
}

// TestPrivilegedSmallImagesRun: the registrar, the test workloads and pause run in their
// unpacked images (static binaries, nothing else); pause ends with status 0 on SIGTERM, as a
// sandbox must.
func TestPrivilegedSmallImagesRun(t *testing.T) {
	testenv.RequireRoot(t)
	imgs := builtImages(t)
	reg := unpack(t, imgs[RegistrarImage])
	runIn(t, reg, nil, "", "/usr/local/bin/aether-registrar", "--help")
	wl := unpack(t, imgs[WorkloadsImage])
	for _, w := range []string{"echo", "client", "serverfirst"} {
		runIn(t, wl, nil, "", "/usr/local/bin/"+w, "-h")
	}

	cmd := inImage(unpack(t, imgs[PauseImage]), nil, "/pause")
	if err := testenv.StartCmd(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// SIGTERM before pause handles it would kill it by the signal. The Go runtime catches
	// SIGTERM from its start (SigCgt), and main's signal.Notify follows within microseconds.
	sigterm := uint64(1) << (uint(syscall.SIGTERM) - 1)
	for caught := false; !caught; {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		var mask uint64
		if _, v, ok := strings.Cut(string(b), "SigCgt:\t"); ok {
			mask, _ = strconv.ParseUint(strings.Fields(v)[0], 16, 64)
		}
		caught = mask&sigterm != 0
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("pause after SIGTERM: %v, want exit status 0", err)
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("pause did not end within 10 s of SIGTERM")
	}
}

// TestPrivilegedSPIREImagesRun: in their unpacked images (chroot) the cgo-built spire-server and
// spire-agent run (the Debian layer is all the glibc they link) and report the pinned version,
// and so does the SPIRE Controller Manager's help; the agent image's entrypoint runs spire-agent
// under umask 077, so the directory it creates for its admin socket is 0700 (only root reaches
// the Delegated Identity API) while the Workload API's directory, made by the kubelet in a pod,
// is not its concern.
func TestPrivilegedSPIREImagesRun(t *testing.T) {
	testenv.RequireRoot(t)
	tools := testenv.RequireTools(t, testenv.ToolSPIRE)
	imgs := builtImages(t)
	version := strings.TrimPrefix(tools.Versions["SPIRE_VERSION"], "v")
	server := unpack(t, imgs[SPIREServerImage])
	if out := runIn(t, server, nil, "", "/usr/local/bin/spire-server", "--version"); strings.TrimSpace(out) != version {
		t.Errorf("spire-server --version: %q, want %s", out, version)
	}
	cm := unpack(t, imgs[SPIREControllerManagerImage])
	if out, err := inImage(cm, nil, "/usr/local/bin/spire-controller-manager", "-help").CombinedOutput(); err != nil || !strings.Contains(string(out), "-expand-env") {
		t.Errorf("spire-controller-manager -help: %v: %s; want its flags", err, out)
	}

	agent := unpack(t, imgs[SPIREAgentImage])
	if out := runIn(t, agent, nil, "", "/usr/local/bin/aether-spire-agent-entrypoint", "--version"); strings.TrimSpace(out) != version {
		t.Errorf("entrypoint --version: %q, want spire-agent's %s", out, version)
	}
	// A configuration that gets the agent as far as its endpoints: the admin socket's directory
	// is made before the agent tries to attest (to a server that is not there).
	conf := `agent {
  data_dir = "/tmp/data"
  server_address = "127.0.0.1"
  server_port = "1"
  socket_path = "/run/spire/agent-sockets/spire-agent.sock"
  admin_socket_path = "/run/spire/agent-admin/admin.sock"
  insecure_bootstrap = true
  join_token = "not-a-token"
  trust_domain = "aether.internal"
}
plugins {
  NodeAttestor "join_token" {
    plugin_data {}
  }
  KeyManager "memory" {
    plugin_data {}
  }
}
`
	if err := os.WriteFile(filepath.Join(agent, "tmp", "agent.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := inImage(agent, nil, "/usr/local/bin/aether-spire-agent-entrypoint", "run", "-config", "/tmp/agent.conf")
	// Read while the agent writes: a Buffer safe for that.
	var out testenv.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := testenv.StartCmd(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	adminDir := filepath.Join(agent, "run", "spire", "agent-admin")
	testenv.Eventually(t, 30*time.Second, "spire-agent creates its admin socket's directory", func() error {
		if _, err := os.Stat(adminDir); err != nil {
			return fmt.Errorf("%w (agent output: %s)", err, testenv.Tail(out.String(), 500))
		}
		return nil
	})
	st, err := os.Stat(adminDir)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if st.Mode().Perm() != 0o700 || sys.Uid != 0 {
		t.Errorf("admin socket directory: mode %v, uid %d; want 0700, root (umask 077)", st.Mode().Perm(), sys.Uid)
	}
}
