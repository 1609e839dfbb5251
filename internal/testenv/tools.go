package testenv

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// InstallHint is the command that provides every tool testenv looks for.
const InstallHint = "make tools (or: hack/tools.sh)"

// Tools are the absolute paths of the cached tool binaries, as hack/tools.sh lays them out under
// AETHER_TOOLS_DIR (default /var/cache/aether-tools) for the versions in hack/versions.env. Each
// path can be overridden by an environment variable of the same name as the field's tag.
type Tools struct {
	Dir           string // AETHER_TOOLS_DIR
	Envoy         string // AETHER_ENVOY
	KubeAPIServer string // AETHER_KUBE_APISERVER
	Etcd          string // AETHER_ETCD
	CNIBinDir     string // AETHER_CNI_BIN_DIR: bridge, host-local, loopback, portmap
	// KubernetesDir holds kube-apiserver, kubelet, kube-controller-manager, kube-scheduler,
	// kube-proxy and kubectl (AETHER_KUBERNETES_DIR).
	KubernetesDir string
	// ContainerdDir holds containerd, containerd-shim-runc-v2 and ctr (AETHER_CONTAINERD_DIR).
	ContainerdDir string
	Runc          string // AETHER_RUNC
	Crictl        string // AETHER_CRICTL
	Helm          string // AETHER_HELM
	CoreDNS       string // AETHER_COREDNS
	Versions      map[string]string
}

var (
	toolsOnce sync.Once
	tools     Tools
	toolsErr  error
)

// RepoRoot returns the repository root: the nearest directory above the working directory that
// holds hack/versions.env. It returns an error when there is none.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "versions.env")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find repository root: no hack/versions.env above the working directory")
		}
		dir = parent
	}
}

// ReadVersions parses a KEY=VALUE file (hack/versions.env: comments, blank lines and double-quoted
// values allowed) into a map.
func ReadVersions(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read versions: %w", err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("read versions: %s:%d: want KEY=VALUE, got %q", path, n, line)
		}
		out[k] = strings.Trim(v, `"`)
	}
	return out, sc.Err()
}

// FindTools locates the tool cache for this checkout's pinned versions. It does not check that
// the binaries exist (see RequireTools).
func FindTools() (Tools, error) {
	toolsOnce.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			toolsErr = err
			return
		}
		v, err := ReadVersions(filepath.Join(root, "hack", "versions.env"))
		if err != nil {
			toolsErr = err
			return
		}
		dir := env("AETHER_TOOLS_DIR", "/var/cache/aether-tools")
		k8s := env("AETHER_KUBERNETES_DIR", filepath.Join(dir, "kubernetes-"+v["KUBERNETES_VERSION"]))
		tools = Tools{
			Dir:           dir,
			Envoy:         env("AETHER_ENVOY", filepath.Join(dir, "envoy-"+v["ENVOY_VERSION"], "bin", "envoy")),
			KubeAPIServer: env("AETHER_KUBE_APISERVER", filepath.Join(k8s, "kube-apiserver")),
			KubernetesDir: k8s,
			ContainerdDir: env("AETHER_CONTAINERD_DIR", filepath.Join(dir, "containerd-"+v["CONTAINERD_VERSION"])),
			Runc:          env("AETHER_RUNC", filepath.Join(dir, "runc-"+v["RUNC_VERSION"], "runc")),
			Crictl:        env("AETHER_CRICTL", filepath.Join(dir, "crictl-"+v["CRICTL_VERSION"], "crictl")),
			Helm:          env("AETHER_HELM", filepath.Join(dir, "helm-"+v["HELM_VERSION"], "helm")),
			CoreDNS:       env("AETHER_COREDNS", filepath.Join(dir, "coredns-"+v["COREDNS_VERSION"], "coredns")),
			Etcd:          env("AETHER_ETCD", filepath.Join(dir, "etcd-"+v["ETCD_VERSION"], "etcd")),
			CNIBinDir:     env("AETHER_CNI_BIN_DIR", filepath.Join(dir, "cni-plugins-"+v["CNI_PLUGINS_VERSION"])),
			Versions:      v,
		}
	})
	return tools, toolsErr
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Tool names accepted by RequireTools.
const (
	ToolEnvoy         = "envoy"
	ToolKubeAPIServer = "kube-apiserver"
	ToolEtcd          = "etcd"
	ToolCNIPlugins    = "cni-plugins"
	// ToolNodes is what a real node runs: kubelet, kube-proxy, containerd with its shim, runc,
	// plus kube-controller-manager, kube-scheduler and kubectl.
	ToolNodes = "nodes"
	ToolHelm  = "helm"
)

// RequireTools returns the tool paths and fails the test, naming the command that installs them,
// when any of the named tools (ToolEnvoy, ...) is missing. It never skips.
func RequireTools(t testing.TB, names ...string) Tools {
	t.Helper()
	tl, err := FindTools()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	for _, n := range names {
		var paths []string
		switch n {
		case ToolEnvoy:
			paths = []string{tl.Envoy}
		case ToolKubeAPIServer:
			paths = []string{tl.KubeAPIServer}
		case ToolEtcd:
			paths = []string{tl.Etcd}
		case ToolNodes:
			for _, b := range []string{"kubelet", "kube-proxy", "kube-controller-manager", "kube-scheduler", "kubectl"} {
				paths = append(paths, filepath.Join(tl.KubernetesDir, b))
			}
			for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
				paths = append(paths, filepath.Join(tl.ContainerdDir, b))
			}
			paths = append(paths, tl.Runc, tl.Crictl, tl.CoreDNS)
		case ToolHelm:
			paths = []string{tl.Helm}
		case ToolCNIPlugins:
			for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
				paths = append(paths, filepath.Join(tl.CNIBinDir, p))
			}
		default:
			t.Fatalf("testenv: unknown tool %q", n)
		}
		for _, p := range paths {
			if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
				t.Fatalf("testenv: %s is missing (%s); install it with: %s", n, p, InstallHint)
			}
		}
	}
	return tl
}

// RequireRoot skips the test with a clear message when it does not run as root, except in CI
// (CI=true), where privileged tests must run and a missing privilege fails the test.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("testenv: this privileged test needs root (network namespaces, nftables); CI must run it as root")
	}
	t.Skip("testenv: privileged test: needs root (run make test as root)")
}
