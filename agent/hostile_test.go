package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestAgentStartsWithAnUnreadableAttachment: one attachment record in --state-dir that does not
// parse (a disk error, a hand edit) does not keep the agent from starting: it becomes ready,
// serving the other pods, and its log names the file. Before, the agent exited at start ("read
// persisted attachments"), which took the whole node's CNI ADDs and DNS down with it.
func TestAgentStartsWithAnUnreadableAttachment(t *testing.T) {
	api, etcd, cs := startSources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createNodeAndMeshNamespace(t, ctx, cs)

	a := startAgent(t, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0])
	a.waitReady(t, 60*time.Second, "agent ready")
	bad := filepath.Join(a.stateDir, "0123abcd_eth0.json")
	if err := os.WriteFile(bad, []byte(`{"attachment": {"containerID": "0123abcd", "ips": ["10.244.`), 0o600); err != nil {
		t.Fatal(err)
	}
	a.killAndRestart(t)
	a.waitReady(t, 60*time.Second, "agent ready again with an unreadable attachment record")
	testenv.Eventually(t, 30*time.Second, "the log names the unreadable record", func() error {
		b, err := os.ReadFile(a.logPath)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), "0123abcd_eth0.json") {
			return os.ErrNotExist
		}
		return nil
	})
}
