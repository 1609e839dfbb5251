package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMain removes the agent binary the tests built (buildAgent) once they are done.
func TestMain(m *testing.M) {
	code := m.Run()
	if agentBin != "" {
		_ = os.RemoveAll(filepath.Dir(agentBin))
	}
	os.Exit(code)
}
