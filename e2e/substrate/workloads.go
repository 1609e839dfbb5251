package substrate

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/aethermesh/aether/internal/testenv"
)

// Workloads are the test workload programs under e2e/workloads, by name.
var Workloads = []string{"echo", "serverfirst", "client"}

// BuildWorkloads builds the test workloads (e2e/workloads/<name>) into outDir with the go tool,
// statically (CGO_ENABLED=0), and returns each binary's path by name. It runs from the
// repository root (testenv.RepoRoot).
func BuildWorkloads(ctx context.Context, outDir string) (map[string]string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, fmt.Errorf("build workloads: %w", err)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, fmt.Errorf("build workloads: %w", err)
	}
	args := []string{"build", "-o", outDir + "/"}
	out := map[string]string{}
	for _, w := range Workloads {
		args = append(args, "./e2e/workloads/"+w)
		out[w] = filepath.Join(outDir, w)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build workloads: %w: %s", err, b)
	}
	return out, nil
}
