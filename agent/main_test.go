package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMain removes the agent binary the tests built (buildAgent) once they are done.
// Run as spireCallerEnv's helper process, it does that instead.
func TestMain(m *testing.M) {
	if v := os.Getenv(spireCallerEnv); v != "" {
		os.Exit(spireCaller(v))
	}
	code := m.Run()
	if agentBin != "" {
		_ = os.RemoveAll(filepath.Dir(agentBin))
	}
	os.Exit(code)
}
