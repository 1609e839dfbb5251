//go:build linux

package substrate

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a process the substrate started and stops at teardown: a control-plane binary, a
// node or cluster process started by a hook, or a pod's container.
type Process struct {
	// Name is unique within the run ("alpha-node1/aether-agent").
	Name string
	// Log is the file holding the process's stdout and stderr.
	Log string

	cmd     *exec.Cmd
	pidFile string
	done    chan struct{}
	err     error
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitErr returns the process's exit error once Done is closed (nil for status 0).
func (p *Process) ExitErr() error { <-p.done; return p.err }

// Stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs the group and waits.
func (p *Process) Stop(grace time.Duration) {
	pid := p.cmd.Process.Pid
	select {
	case <-p.done:
	default:
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
		}
	}
	// The group may hold children that outlived the leader.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-p.done
	_ = os.Remove(p.pidFile)
}

// pinnedThread runs functions on one goroutine locked to its OS thread for as long as the
// substrate lives. Every long-lived child is forked from it: Pdeathsig fires when the forking
// *thread* exits (golang/go#27505), and the Go runtime ends threads whose locked goroutine
// returns, which the namespace helpers do on purpose. A child forked from an ordinary goroutine
// could therefore be killed when a later namespace operation happens to lock that same thread.
type pinnedThread struct {
	reqs chan func()
	once sync.Once
}

func newPinnedThread() *pinnedThread {
	t := &pinnedThread{reqs: make(chan func())}
	go func() {
		runtime.LockOSThread()
		for f := range t.reqs {
			f()
		}
	}()
	return t
}

// do runs f on the pinned thread and waits for it.
func (t *pinnedThread) do(f func()) {
	done := make(chan struct{})
	t.reqs <- func() { f(); close(done) }
	<-done
}

// close ends the thread; call it only when no child forked from it runs any more.
func (t *pinnedThread) close() { t.once.Do(func() { close(t.reqs) }) }

// procTable starts and tracks processes, recording "pid starttime" per process under pidDir so
// that Clean can kill them after a crash without hitting a reused pid.
type procTable struct {
	pidDir string
	thread *pinnedThread
	mu     sync.Mutex
	procs  map[string]*Process
}

func newProcTable(pidDir string) (*procTable, error) {
	if err := os.MkdirAll(pidDir, 0o755); err != nil {
		return nil, fmt.Errorf("create pid dir: %w", err)
	}
	return &procTable{pidDir: pidDir, thread: newPinnedThread(), procs: map[string]*Process{}}, nil
}

// start runs argv with env (nil: the substrate's environment) in its own process group, with
// stdout and stderr appended to logPath. The process gets SIGKILL when the substrate dies
// (Pdeathsig), so a crashed run leaves nothing running in the root namespaces.
func (t *procTable) start(name string, argv, env []string, logPath string) (*Process, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("start %s: empty command", name)
	}
	t.mu.Lock()
	if _, dup := t.procs[name]; dup {
		t.mu.Unlock()
		return nil, fmt.Errorf("start %s: a process of that name runs already", name)
	}
	t.procs[name] = nil
	t.mu.Unlock()
	p, err := t.spawn(name, argv, env, logPath)
	t.mu.Lock()
	if err != nil {
		delete(t.procs, name)
	} else {
		t.procs[name] = p
	}
	t.mu.Unlock()
	return p, err
}

func (t *procTable) spawn(name string, argv, env []string, logPath string) (*Process, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var err2 error
	t.thread.do(func() { err2 = cmd.Start() })
	if err2 != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err2)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	p.pidFile = filepath.Join(t.pidDir, strings.ReplaceAll(name, "/", "_")+".pid")
	if st, err := procStartTime(cmd.Process.Pid); err == nil {
		_ = os.WriteFile(p.pidFile, fmt.Appendf(nil, "%d %d\n", cmd.Process.Pid, st), 0o644)
	}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// remove forgets a stopped process.
func (t *procTable) remove(name string) {
	t.mu.Lock()
	delete(t.procs, name)
	t.mu.Unlock()
}

// stopAll stops every process, those whose name starts with prefix ("" for all), in parallel.
func (t *procTable) stopAll(prefix string, grace time.Duration) {
	t.mu.Lock()
	var ps []*Process
	for n, p := range t.procs {
		if p != nil && strings.HasPrefix(n, prefix) {
			ps = append(ps, p)
			delete(t.procs, n)
		}
	}
	t.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() { p.Stop(grace) })
	}
	wg.Wait()
}

// pids returns the pids of the running processes.
func (t *procTable) pids() []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []int
	for _, p := range t.procs {
		if p != nil {
			out = append(out, p.Pid())
		}
	}
	return out
}

// procStartTime reads field 22 of /proc/<pid>/stat (start time in clock ticks since boot).
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// procRSS returns the resident set size of pid in bytes (VmRSS of /proc/<pid>/status).
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024, err
			}
		}
	}
	return 0, fmt.Errorf("read rss of %d: no VmRSS", pid)
}
