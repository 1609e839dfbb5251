package testenv

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// ProcsWhere returns the pids whose /proc/<pid>/<file> content match accepts (file is a name
// such as "cmdline" or "stat"). Processes that exit while it reads are skipped. A failure to
// read /proc itself fails the test.
func ProcsWhere(t testing.TB, file string, match func(pid int, content []byte) bool) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/" + file); err == nil && match(pid, b) {
			out = append(out, pid)
		}
	}
	return out
}

// ProcessRunning reports whether pid exists and is not a zombie (state field of
// /proc/<pid>/stat, proc(5)).
func ProcessRunning(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}

// EnvoysIn lists the running Envoy processes (argv[0] ends in "envoy") whose command line
// names a path under dir: the Envoys a test started from its own state directory.
func EnvoysIn(t testing.TB, dir string) []int {
	t.Helper()
	return ProcsWhere(t, "cmdline", func(pid int, b []byte) bool {
		args := strings.Split(string(b), "\x00")
		return len(args) > 0 && strings.HasSuffix(args[0], "envoy") && strings.Contains(string(b), dir) && ProcessRunning(pid)
	})
}
