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
	var pkgs []string
	for _, w := range Workloads {
		pkgs = append(pkgs, "./e2e/workloads/"+w)
	}
	return buildPrograms(ctx, outDir, pkgs...)
}

// buildPrograms builds main packages (paths relative to the repository root) into outDir,
// statically (CGO_ENABLED=0), and returns each binary's path by its name.
func buildPrograms(ctx context.Context, outDir string, pkgs ...string) (map[string]string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, fmt.Errorf("build %v: %w", pkgs, err)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, fmt.Errorf("build %v: %w", pkgs, err)
	}
	args := []string{"build", "-o", outDir + "/"}
	out := map[string]string{}
	for _, p := range pkgs {
		args = append(args, p)
		out[filepath.Base(p)] = filepath.Join(outDir, filepath.Base(p))
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build %v: %w: %s", pkgs, err, b)
	}
	return out, nil
}
