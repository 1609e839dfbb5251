package bpf

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestVerifyBPFFailsOnStaleFile runs hack/verify-bpf.sh in a scratch copy of the repository
// (go.mod, go.sum, bpf/, the two scripts): the untouched copy passes, and after a change to a C
// source that changes the compiled object the script fails naming the stale generated file.
func TestVerifyBPFFailsOnStaleFile(t *testing.T) {
	for _, tool := range []string{"clang-14", "llvm-strip-14"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: run hack/tools.sh (Debian packages clang-14, llvm-14)", tool)
		}
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	scratch := t.TempDir()
	for _, f := range []string{"go.mod", "go.sum", "bpf", "hack/update-bpf.sh", "hack/verify-bpf.sh"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(scratch, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-R", filepath.Join(root, f), filepath.Join(scratch, f)).CombinedOutput(); err != nil {
			t.Fatalf("copy %s: %v: %s", f, err, out)
		}
	}
	verify := func() (string, error) {
		cmd := exec.Command(filepath.Join(scratch, "hack/verify-bpf.sh"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	if out, err := verify(); err != nil {
		t.Fatalf("verify-bpf.sh on an untouched copy: %v\n%s", err, out)
	}

	src := filepath.Join(scratch, "bpf/capture/prog.c")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	const from, to = "#define MAX_PODS 4096", "#define MAX_PODS 4097"
	if !bytes.Contains(b, []byte(from)) {
		t.Fatalf("%s has no %q to change", src, from)
	}
	if err := os.WriteFile(src, bytes.Replace(b, []byte(from), []byte(to), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := verify()
	if err == nil {
		t.Fatalf("verify-bpf.sh passed after %s changed:\n%s", src, out)
	}
	const want = "verify-bpf: bpf/capture/prog_bpfel.o is stale: run hack/update-bpf.sh"
	if !strings.Contains(out, want) {
		t.Fatalf("verify-bpf.sh failed without naming the stale file (want %q):\n%s", want, out)
	}
}
