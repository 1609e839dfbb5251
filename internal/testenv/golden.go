package testenv

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Golden compares got with the golden file testdata/<name> of the calling test's package
// directory. With REFRESH_GOLDEN set (to anything) it writes got there instead (creating
// testdata/), and the diff is reviewed in version control. A missing file or a difference fails
// the test, naming the file, the first line that differs (1-based) with a few lines around it
// from both sides, and the refresh command.
func Golden(t testing.TB, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if os.Getenv("REFRESH_GOLDEN") != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden %s (refresh with REFRESH_GOLDEN=1): %v", path, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file; review and refresh with REFRESH_GOLDEN=1:\n%s", path, firstDiff(string(got), string(want)))
	}
}

// firstDiff describes where got and want first differ: the line number and up to three lines
// before and after it from each side.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	i := 0
	for i < len(g) && i < len(w) && g[i] == w[i] {
		i++
	}
	excerpt := func(lines []string) string {
		from, to := max(0, i-3), min(len(lines), i+4)
		var b strings.Builder
		for j := from; j < to; j++ {
			mark := " "
			if j == i {
				mark = ">"
			}
			fmt.Fprintf(&b, "%s %5d  %s\n", mark, j+1, lines[j])
		}
		return b.String()
	}
	return fmt.Sprintf("first difference at line %d (got %d lines, want %d)\n--- got\n%s--- want\n%s", i+1, len(g), len(w), excerpt(g), excerpt(w))
}
