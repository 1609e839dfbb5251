//go:build linux

package substrate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// nodeExec is libcni's plugin runner for one node: it runs each plugin in the node's network
// namespace and in a mount namespace with the node's files bound on their real paths
// (/etc/cni/net.d, /opt/cni/bin, /run/flannel, /var/lib/cni, ...), as a kubelet on that node
// would run it. It implements invoke.Exec.
type nodeExec struct {
	netnsPath string
	binds     [][2]string
}

var _ invoke.Exec = (*nodeExec)(nil)

// ExecPlugin runs the plugin with the CNI environment and stdin (CNI spec section "Protocol
// parameters"); a non-zero exit returns the plugin's error object from stdout when it printed one.
func (e *nodeExec) ExecPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error) {
	argv := nsWrap(e.netnsPath, e.binds, "", []string{pluginPath})
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = environ
	cmd.Stdin = bytes.NewReader(stdinData)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var perr types.Error
		if json.Unmarshal(stdout.Bytes(), &perr) == nil && perr.Code != 0 {
			return nil, &perr
		}
		return nil, fmt.Errorf("run CNI plugin %s: %w: %s", pluginPath, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// FindInPath finds the plugin binary in paths.
func (e *nodeExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

// Decode parses a plugin's VERSION answer.
func (e *nodeExec) Decode(jsonBytes []byte) (version.PluginInfo, error) {
	return (&version.PluginDecoder{}).Decode(jsonBytes)
}
