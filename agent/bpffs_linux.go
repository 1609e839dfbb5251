package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ensureBPFFS makes dir a directory in a bpffs, mounting one there (mode 0700) when it is not.
func ensureBPFFS(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make the pin directory: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs: %w", err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpffs", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs: %w", err)
	}
	return nil
}

// underCgroup returns nil when process pid sits in the cgroup2 hierarchy mounted at root (its
// cgroup, the "0::" line of /proc/<pid>/cgroup, is a directory under root listing pid), else an
// error naming its cgroup.
func underCgroup(pid int, root string) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		path, ok := strings.CutPrefix(sc.Text(), "0::")
		if !ok {
			continue
		}
		procs, err := os.ReadFile(filepath.Join(root, path, "cgroup.procs"))
		if err != nil {
			return fmt.Errorf("process %d in cgroup %s, not under %s: %w", pid, path, root, err)
		}
		for _, f := range strings.Fields(string(procs)) {
			if f == strconv.Itoa(pid) {
				return nil
			}
		}
		return fmt.Errorf("process %d in cgroup %s, not under %s (it does not list the process)", pid, path, root)
	}
	return errors.New("no cgroup v2 entry in /proc/" + strconv.Itoa(pid) + "/cgroup")
}
