//go:build linux

package substrate

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// runProcesses returns the pids of the processes that belong to a run: those whose command line
// names a path inside the run directory (API servers, etcds; "<dir>/", so that run aesub-12 never
// matches aesub-123) and those in one of its network namespaces (node
// processes, pods, CNI plugins). The calling process is never included.
func runProcesses(dir string) ([]int, error) {
	inodes := map[uint64]bool{}
	entries, _ := os.ReadDir(filepath.Join(dir, "netns"))
	for _, e := range entries {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(dir, "netns", e.Name()), &st) == nil && st.Dev != 0 {
			inodes[st.Ino] = true
		}
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	self := os.Getpid()
	var out []int
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == self {
			continue
		}
		if cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && bytes.Contains(cl, []byte(dir+"/")) {
			out = append(out, pid)
			continue
		}
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) == nil && inodes[st.Ino] {
			out = append(out, pid)
		}
	}
	return out, nil
}

// mountsUnder returns the mount points at or below dir in this mount namespace, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, sc.Err()
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// ownerAlive reports whether the process that made a run directory (owner.pid: "pid starttime")
// still runs.
func ownerAlive(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
	if err != nil {
		return false
	}
	var pid int
	var start uint64
	if _, err := fmt.Sscanf(string(b), "%d %d", &pid, &start); err != nil {
		return false
	}
	st, err := procStartTime(pid)
	return err == nil && st == start
}

// Clean removes what crashed substrate runs left in baseDir (default os.TempDir()): for every
// run directory aesub-* whose owner no longer runs (or every one, with force), it kills the
// run's processes, unmounts its namespace files and its namespace directory, and removes the
// directory. It returns the run directories it cleaned.
func Clean(baseDir string, force bool, log *slog.Logger) ([]string, error) {
	if baseDir == "" {
		baseDir = os.TempDir()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dirs, err := filepath.Glob(filepath.Join(baseDir, Prefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("clean substrate: %w", err)
	}
	var cleaned []string
	for _, dir := range dirs {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			continue
		}
		if !force && ownerAlive(dir) {
			log.Info("skip running substrate", "dir", dir)
			continue
		}
		if err := cleanRun(dir); err != nil {
			return cleaned, err
		}
		log.Info("cleaned", "dir", dir)
		cleaned = append(cleaned, dir)
	}
	return cleaned, nil
}

// recordedProcesses returns the pids recorded under <dir>/pids ("pid starttime") that still run
// with the same start time.
func recordedProcesses(dir string) []int {
	files, _ := filepath.Glob(filepath.Join(dir, "pids", "*.pid"))
	var out []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var pid int
		var start uint64
		if _, err := fmt.Sscanf(string(b), "%d %d", &pid, &start); err != nil {
			continue
		}
		if st, err := procStartTime(pid); err == nil && st == start {
			out = append(out, pid)
		}
	}
	return out
}

func cleanRun(dir string) error {
	for range 3 {
		pids, err := runProcesses(dir)
		if err != nil {
			return err
		}
		pids = append(pids, recordedProcesses(dir)...)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(300 * time.Millisecond)
	}
	// Real nodes: containers and containerd's shims outlive the substrate (they are not its
	// children); they are all in the run's cgroup subtree.
	if err := removeCgroup("/"+filepath.Base(dir), 20*time.Second); err != nil {
		return fmt.Errorf("clean substrate: %w", err)
	}
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("clean substrate: unmount %s: %w", m, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("clean substrate: %w", err)
	}
	return nil
}
