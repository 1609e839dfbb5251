package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recordTB records Errorf and Fatalf; Fatalf stops the caller by panicking, as t.Fatalf's
// runtime.Goexit would.
type recordTB struct {
	testing.TB
	failed bool
	msg    string
}

func (r *recordTB) Helper() {}
func (r *recordTB) Errorf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
}
func (r *recordTB) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(r)
}

// TestGolden: a matching file passes, a differing or missing one fails naming the first
// differing line, and REFRESH_GOLDEN writes the file.
func TestGolden(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("testdata", "x.golden"), []byte("a\nb\nc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REFRESH_GOLDEN", "")

	ok := &recordTB{TB: t}
	Golden(ok, "x.golden", []byte("a\nb\nc\n"))
	if ok.failed {
		t.Errorf("matching golden failed: %s", ok.msg)
	}

	bad := &recordTB{TB: t}
	Golden(bad, "x.golden", []byte("a\nB\nc\n"))
	if !bad.failed || !strings.Contains(bad.msg, "first difference at line 2") || !strings.Contains(bad.msg, ">     2  B") {
		t.Errorf("differing golden: failed=%v msg %q, want line 2 named", bad.failed, bad.msg)
	}

	missing := &recordTB{TB: t}
	func() {
		defer func() { _ = recover() }()
		Golden(missing, "none.golden", []byte("a"))
	}()
	if !missing.failed || !strings.Contains(missing.msg, "REFRESH_GOLDEN=1") {
		t.Errorf("missing golden: failed=%v msg %q", missing.failed, missing.msg)
	}

	t.Setenv("REFRESH_GOLDEN", "1")
	Golden(t, "sub/new.golden", []byte("fresh\n"))
	if b, err := os.ReadFile(filepath.Join("testdata", "sub", "new.golden")); err != nil || string(b) != "fresh\n" {
		t.Errorf("refresh wrote %q, %v", b, err)
	}
}
