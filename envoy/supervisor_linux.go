//go:build linux

package envoy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// SupervisorConfig configures the Envoy supervisor.
type SupervisorConfig struct {
	// EnvoyPath is the Envoy binary.
	EnvoyPath string
	// Bootstrap is written to StateDir/bootstrap.json before every start.
	Bootstrap BootstrapConfig
	// StateDir holds the bootstrap, Envoy's pid file, its lock file (envoy.lock) and its logs.
	// It must survive agent restarts (the lock and the pid file are how a restarted agent
	// recognises the Envoy it started). One StateDir per node: supervisors sharing it never run
	// two Envoys.
	StateDir string
	// Prefix is prepended to Envoy's command line, e.g. ["ip", "netns", "exec", "node1"]; empty
	// in production and in the local substrate (tests use it to wrap Envoy).
	Prefix []string
	// ExtraArgs are appended to Envoy's command line.
	ExtraArgs []string
	// MinBackoff and MaxBackoff bound the restart delay after Envoy dies (defaults 200 ms and
	// 30 s); the delay doubles after each death within StableAfter of its start.
	MinBackoff, MaxBackoff time.Duration
	// StableAfter is how long an Envoy must have run before its death resets the restart delay
	// to MinBackoff (default 1 min).
	StableAfter time.Duration
	// CheckInterval is how often a running Envoy is checked (default 1 s).
	CheckInterval time.Duration
	// MaxLogBytes bounds each of Envoy's output files in StateDir (envoy.out: its stdout and
	// stderr, which carry the authorization access log; envoy.log: its own log): every
	// CheckInterval, a file larger than this is copied to <name>.1 (replacing the previous copy)
	// and truncated, so each takes at most about twice this on disk (default 64 MiB). A pod can
	// make Envoy write (every refused call is logged): without a bound it could fill the node's
	// disk.
	MaxLogBytes int64
	Logger      *slog.Logger
}

// Supervisor keeps exactly one Envoy running for the node. Envoy runs in its own session and
// outlives the agent.
//
// At most one Envoy per StateDir runs by construction: a supervisor starts Envoy only while it
// holds the flock(2) lock of StateDir/envoy.lock, and Envoy inherits that locked open file (as
// fd 3, exec.Cmd.ExtraFiles) before the supervisor closes its own copy, so the lock stays held
// exactly as long as that Envoy (and any process it forks) lives, across agent restarts, and the
// kernel drops it when Envoy dies, even by SIGKILL. A supervisor that finds the lock held adopts
// that Envoy (its pid from the pid file once the pid names a process holding the lock file) and
// watches the lock; one that finds it free knows no Envoy it could have started runs, adopts an
// Envoy started by an agent that predates the lock (the pid file names a live process whose
// command line has our bootstrap path, or the admin API answers with our node id) and otherwise
// starts one. It never adopts or signals another process. A dead Envoy is restarted with
// exponential backoff.
type Supervisor struct {
	cfg SupervisorConfig
	log *slog.Logger

	mu      sync.Mutex
	pid     int
	starts  int
	adopted bool
	// locked: the adopted Envoy holds envoy.lock (watch the lock, not the pid); false for an
	// Envoy we started (watch waitCh) and for one started by an agent without the lock.
	locked bool
	waitCh chan struct{} // closed when a child we started exits

	// sleep is how Run waits out a restart delay (sleepCtx); a test seam: tests wrap it to
	// record the delays Run asks for. Set before Run starts.
	sleep func(ctx context.Context, d time.Duration) bool
	// lockPath is StateDir/envoy.lock.
	lockPath string
}

// NewSupervisor checks cfg and returns a Supervisor. It returns an error naming the missing
// field.
func NewSupervisor(cfg SupervisorConfig) (*Supervisor, error) {
	if cfg.EnvoyPath == "" {
		return nil, errors.New("new supervisor: empty EnvoyPath")
	}
	if cfg.StateDir == "" {
		return nil, errors.New("new supervisor: empty StateDir")
	}
	cfg.Bootstrap = cfg.Bootstrap.withDefaults()
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 200 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.StableAfter <= 0 {
		cfg.StableAfter = time.Minute
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = time.Second
	}
	if cfg.MaxLogBytes <= 0 {
		cfg.MaxLogBytes = 64 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("new supervisor: StateDir %s: %w", cfg.StateDir, err)
	}
	return &Supervisor{cfg: cfg, log: cfg.Logger, sleep: sleepCtx, lockPath: filepath.Join(cfg.StateDir, "envoy.lock")}, nil
}

// sleepCtx waits d or until ctx ends; it reports whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// restartBackoff is Run's restart delay policy: the first restart waits min; each death of an
// Envoy that ran less than stableAfter doubles the delay, up to max; a death after at least
// stableAfter of uptime starts again from min.
type restartBackoff struct {
	min, max, stableAfter time.Duration
	next                  time.Duration // delay of the next restart; 0 before the first death
}

// delay returns how long to wait before restarting an Envoy that died after running for uptime.
func (b *restartBackoff) delay(uptime time.Duration) time.Duration {
	if b.next == 0 || uptime >= b.stableAfter {
		b.next = b.min
	}
	d := min(b.next, b.max)
	b.next = min(b.next*2, b.max)
	return d
}

func (s *Supervisor) pidFile() string { return filepath.Join(s.cfg.StateDir, "envoy.pid") }

// LogPath is Envoy's own log file.
func (s *Supervisor) LogPath() string { return filepath.Join(s.cfg.StateDir, "envoy.log") }

// PID returns the pid of the Envoy being supervised (0 when none).
func (s *Supervisor) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

// Starts returns how many Envoy processes this supervisor started (adoptions not counted).
func (s *Supervisor) Starts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts
}

// Adopted reports whether the current Envoy was found running rather than started.
func (s *Supervisor) Adopted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.adopted
}

// ServerInfo is the part of Envoy's /server_info the supervisor reads.
type ServerInfo struct {
	State       string `json:"state"`
	Version     string `json:"version"`
	CommandLine struct {
		ServiceNode string `json:"service_node"`
	} `json:"command_line_options"`
	Node struct {
		ID string `json:"id"`
	} `json:"node"`
}

// serverInfo asks the admin API for /server_info.
func (s *Supervisor) serverInfo(ctx context.Context) (*ServerInfo, error) {
	c, base := AdminClient(s.cfg.Bootstrap.AdminAddress)
	_, b, err := adminGet(ctx, c, base+"/server_info")
	if err != nil {
		return nil, err
	}
	var si ServerInfo
	if err := json.Unmarshal(b, &si); err != nil {
		return nil, fmt.Errorf("decode /server_info: %w", err)
	}
	return &si, nil
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	// A zombie still answers kill(0); /proc/<pid>/stat's state field tells.
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && b[i+2] == 'Z' {
		return false
	}
	return true
}

// ownProcess reports whether pid is this process or one of its threads (a thread id answers
// kill(2) and has a /proc entry like a process; its thread group id, the Tgid line of
// /proc/<pid>/status, is the process's pid). A pid file that survived a reboot can name either.
func ownProcess(pid int) bool {
	self := os.Getpid()
	if pid == self {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			tgid, err := strconv.Atoi(strings.TrimSpace(v))
			return err == nil && tgid == self
		}
	}
	return false
}

// bootPath is the bootstrap file start writes and passes to Envoy with -c.
func (s *Supervisor) bootPath() string { return filepath.Join(s.cfg.StateDir, "bootstrap.json") }

// tryLock opens StateDir/envoy.lock and takes its flock(2) lock without waiting. It returns the
// open file holding the lock (the caller hands it to Envoy or closes it), or nil when another
// open file description holds it: an Envoy of this StateDir runs, or a supervisor is starting
// one. flock locks belong to the open file description, so two supervisors in one process
// exclude each other too.
func (s *Supervisor) tryLock() (*os.File, error) {
	f, err := os.OpenFile(s.lockPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open envoy lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err == nil {
		return f, nil
	}
	f.Close()
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, nil
	}
	return nil, fmt.Errorf("lock %s: %w", s.lockPath, err)
}

// holdsLock reports whether the live process pid has StateDir/envoy.lock open (one of
// /proc/<pid>/fd is that file: same device and inode, whatever path the link shows, which
// depends on mount namespaces): the Envoy a supervisor of this StateDir started, at any point
// after exec.Cmd.Start returned, whatever its command line says at that moment. This process
// (ownProcess) never counts: it has the file open itself while it takes the lock.
func (s *Supervisor) holdsLock(pid int) bool {
	if !alive(pid) || ownProcess(pid) {
		return false
	}
	lock, err := os.Stat(s.lockPath)
	if err != nil {
		return false
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if st, err := os.Stat(dir + e.Name()); err == nil && os.SameFile(st, lock) {
			return true
		}
	}
	return false
}

// ours reports whether pid is a live Envoy started by a supervisor with this StateDir: it holds
// our lock file open (holdsLock), or, for an Envoy started by an agent that predates the lock,
// its command line (/proc/<pid>/cmdline) has our bootstrap path as an argument. The command line
// alone cannot tell for an Envoy just started: it is empty while the kernel is still inside
// execve (after exec.Cmd.Start has returned), and a Prefix wrapper's is the wrapper's. The pid
// file survives reboots and pids are reused, so a live pid alone may be any process, which must
// be neither adopted nor signalled; after a reboot it may even be this process or one of its
// threads (ownProcess), which is never ours.
func (s *Supervisor) ours(pid int) bool {
	if !alive(pid) || ownProcess(pid) {
		return false
	}
	if s.holdsLock(pid) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	return slices.Contains(strings.Split(string(b), "\x00"), s.bootPath())
}

func (s *Supervisor) readPID() int {
	b, err := os.ReadFile(s.pidFile())
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// adoptUnlocked looks for a running Envoy that does not hold the lock (started by an agent that
// predates it): the process in the pid file when it is ours (a foreign process there is logged
// and left alone), or one whose admin API answers with our node id. It returns its pid (0 when
// only the admin API answered) and whether one runs.
func (s *Supervisor) adoptUnlocked(ctx context.Context) (int, bool) {
	pid := s.readPID()
	if s.ours(pid) {
		return pid, true
	}
	if alive(pid) {
		s.log.Warn("pid file names a process that is not our envoy; leaving it alone", "path", s.pidFile(), "pid", pid)
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if si, err := s.serverInfo(actx); err == nil && si.Node.ID == s.cfg.Bootstrap.NodeID {
		return 0, true
	}
	return 0, false
}

// start writes the bootstrap and starts Envoy in its own session (it survives the agent). lock
// is the open file holding envoy.lock (tryLock): Envoy inherits it as fd 3, and start closes
// this copy when it returns, after the pid file is written, so from then on only Envoy holds
// the lock.
func (s *Supervisor) start(lock *os.File) error {
	defer lock.Close()
	boot, err := Bootstrap(s.cfg.Bootstrap)
	if err != nil {
		return fmt.Errorf("start envoy: %w", err)
	}
	bootPath := s.bootPath()
	if err := os.WriteFile(bootPath, boot, 0o644); err != nil {
		return fmt.Errorf("start envoy: write bootstrap: %w", err)
	}
	args := append([]string{}, s.cfg.Prefix...)
	args = append(args, s.cfg.EnvoyPath, "-c", bootPath,
		"--log-path", s.LogPath(), "--disable-hot-restart", "--drain-time-s", "5")
	args = append(args, s.cfg.ExtraArgs...)
	out, err := os.OpenFile(filepath.Join(s.cfg.StateDir, "envoy.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start envoy: %w", err)
	}
	defer out.Close()
	outStart, _ := out.Seek(0, io.SeekEnd)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = []*os.File{lock}
	// Its own session: no signal aimed at the agent's process group reaches Envoy, and Envoy
	// is not killed when the agent exits.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start envoy: %w", err)
	}
	pid := cmd.Process.Pid
	if err := os.WriteFile(s.pidFile(), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait() // reap it: no zombie per failed start
		return fmt.Errorf("start envoy: write pid file: %w", err)
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		s.log.Warn("envoy exited", "pid", pid, "status", cmd.ProcessState.String(), "err", err,
			"last_output", s.lastOutput(outStart))
		close(done)
	}()
	s.mu.Lock()
	s.pid, s.starts, s.adopted, s.locked, s.waitCh = pid, s.starts+1, false, false, done
	s.mu.Unlock()
	s.log.Info("started envoy", "pid", pid, "bootstrap", bootPath)
	return nil
}

// lastOutput returns the last line Envoy wrote to StateDir/envoy.out after offset from (its
// stdout and stderr, where it writes why it exits at start, e.g. "cannot bind
// '127.0.0.1:15000': Address already in use"), at most 512 bytes; "" when it wrote nothing.
func (s *Supervisor) lastOutput(from int64) string {
	f, err := os.Open(filepath.Join(s.cfg.StateDir, "envoy.out"))
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil {
		from = max(from, st.Size()-512)
	}
	b, err := io.ReadAll(io.NewSectionReader(f, from, 512))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// Run keeps one Envoy running until ctx ends; Envoy keeps running afterwards. It adopts a
// running Envoy first and starts one only when none runs. Meanwhile it keeps Envoy's output
// files under MaxLogBytes (boundLogs).
func (s *Supervisor) Run(ctx context.Context) error {
	go s.boundLogs(ctx)
	backoff := &restartBackoff{min: s.cfg.MinBackoff, max: s.cfg.MaxBackoff, stableAfter: s.cfg.StableAfter}
	for {
		watch := s.adoptOrStart(ctx)
		started := time.Now()
		if watch {
			s.watch(ctx)
		}
		if ctx.Err() != nil {
			return nil
		}
		uptime := time.Since(started)
		d := backoff.delay(uptime)
		s.log.Warn("envoy is gone; restarting", "uptime", uptime, "backoff", d)
		if !s.sleep(ctx, d) {
			return nil
		}
	}
}

// adoptOrStart adopts the running Envoy or starts one; it reports whether there is one to
// watch. With envoy.lock held it adopts the holder and never starts; with the lock taken it
// adopts an Envoy that predates the lock or starts one holding it.
func (s *Supervisor) adoptOrStart(ctx context.Context) bool {
	lock, err := s.tryLock()
	if err != nil {
		// Without the lock nothing may be started: wait out the backoff and try again.
		s.log.Error("start envoy", "err", err)
		return false
	}
	if lock == nil {
		pid := s.readPID()
		if !s.holdsLock(pid) {
			pid = 0 // not written yet by the supervisor starting it; watch fills it in
		}
		s.setAdopted(pid, true)
		return true
	}
	if pid, ok := s.adoptUnlocked(ctx); ok {
		lock.Close()
		s.setAdopted(pid, false)
		return true
	}
	if err := s.start(lock); err != nil {
		// Nothing runs to watch (and whatever answers on the admin address is not ours):
		// wait out the backoff and try again.
		s.log.Error("start envoy", "err", err)
		return false
	}
	return true
}

// setAdopted records an Envoy found running: pid (0 when not known) and whether it holds the
// lock.
func (s *Supervisor) setAdopted(pid int, locked bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pid != pid || s.waitCh != nil || !s.adopted || s.locked != locked {
		s.log.Info("adopted running envoy", "pid", pid, "holds_lock", locked)
	}
	s.pid, s.adopted, s.locked, s.waitCh = pid, true, locked, nil
}

// watch returns when the supervised Envoy is gone or ctx ends: the child we started exited; the
// lock an adopted Envoy held is free; an adopted Envoy without the lock is no longer alive, or,
// adopted through its admin API alone, stopped answering with our node id.
func (s *Supervisor) watch(ctx context.Context) {
	t := time.NewTicker(s.cfg.CheckInterval)
	defer t.Stop()
	misses := 0
	for {
		s.mu.Lock()
		pid, locked, waitCh := s.pid, s.locked, s.waitCh
		s.mu.Unlock()
		var exited <-chan struct{}
		if waitCh != nil {
			exited = waitCh
		}
		select {
		case <-ctx.Done():
			return
		case <-exited:
			s.mu.Lock()
			s.pid, s.waitCh = 0, nil
			s.mu.Unlock()
			return
		case <-t.C:
		}
		switch {
		case locked:
			if s.watchLock(pid) {
				return
			}
		case pid > 0:
			if !alive(pid) {
				s.mu.Lock()
				s.pid = 0
				s.mu.Unlock()
				return
			}
		default:
			// Adopted through the admin API only: gone after three failed checks (no answer,
			// or one for another node: another program holds the admin address now).
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			si, err := s.serverInfo(actx)
			cancel()
			if err != nil || si.Node.ID != s.cfg.Bootstrap.NodeID {
				misses++
				if misses >= 3 {
					return
				}
			} else {
				misses = 0
			}
		}
	}
}

// watchLock checks an adopted Envoy that holds envoy.lock; pid is the one known (0: none yet).
// It reports true when the lock is free (every process holding it has exited); otherwise it
// refreshes the pid from the pid file, which the supervisor that started Envoy writes while it
// still holds the lock.
func (s *Supervisor) watchLock(pid int) bool {
	lock, err := s.tryLock()
	if err != nil {
		s.log.Error("watch envoy", "err", err)
		return false
	}
	if lock != nil {
		lock.Close()
		s.mu.Lock()
		s.pid, s.locked = 0, false
		s.mu.Unlock()
		return true
	}
	if pid > 0 && alive(pid) {
		return false
	}
	if p := s.readPID(); p != pid && s.holdsLock(p) {
		pid = p
		s.log.Info("adopted running envoy", "pid", pid, "holds_lock", true)
	} else if pid > 0 {
		pid = 0 // exited, the lock held by what it forked
	}
	s.mu.Lock()
	s.pid = pid
	s.mu.Unlock()
	return false
}

// WaitLive waits until the admin API reports state LIVE with our node id (another program on
// the admin address, such as another node's Envoy, is not ours), or ctx ends.
func (s *Supervisor) WaitLive(ctx context.Context) error {
	for {
		si, err := s.serverInfo(ctx)
		if err == nil && si.Node.ID != s.cfg.Bootstrap.NodeID {
			err = fmt.Errorf("admin %s answers for node %q, not %q", s.cfg.Bootstrap.AdminAddress, si.Node.ID, s.cfg.Bootstrap.NodeID)
		} else if err == nil && si.State == "LIVE" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for envoy to be live: %w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop terminates the supervised Envoy (SIGTERM, then SIGKILL after 10 s) and removes its pid
// file. The Envoy is the one supervised, the pid file's when it is ours (see ours), and every
// process holding envoy.lock open with our bootstrap path on its command line (lockHolders): an
// Envoy a forking Prefix wrapper started is named by no pid file. A pid file naming a process
// that is not our Envoy is removed and that process left alone. It returns an error when
// envoy.lock is still held afterwards (by a process it could not tell for ours). The agent never
// calls it in production (Envoy outlives the agent); tests and an explicit uninstall do.
func (s *Supervisor) Stop() error {
	var pids []int
	pid := s.PID()
	if pid == 0 {
		if pid = s.readPID(); !s.ours(pid) {
			pid = 0
		}
	}
	if alive(pid) {
		pids = append(pids, pid)
	}
	if lock, err := s.tryLock(); err == nil && lock == nil {
		for _, p := range s.lockHolders() {
			if !slices.Contains(pids, p) {
				pids = append(pids, p)
			}
		}
	} else if lock != nil {
		lock.Close()
	}
	anyAlive := func() bool { return slices.ContainsFunc(pids, alive) }
	wait := func(d time.Duration) {
		for deadline := time.Now().Add(d); anyAlive() && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	wait(10 * time.Second)
	for _, p := range pids {
		if alive(p) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	wait(5 * time.Second)
	_ = os.Remove(s.pidFile())
	lock, err := s.tryLock()
	if err != nil {
		return fmt.Errorf("stop envoy: %w", err)
	}
	if lock == nil {
		return fmt.Errorf("stop envoy: %s still held by a process that is not our envoy", s.lockPath)
	}
	lock.Close()
	return nil
}

// lockHolders returns the live processes, other than this one, that hold envoy.lock open
// (holdsLock) and have our bootstrap path as an argument (/proc/<pid>/cmdline): our Envoys,
// whatever started them.
func (s *Supervisor) lockHolders() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !s.holdsLock(pid) {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && slices.Contains(strings.Split(string(b), "\x00"), s.bootPath()) {
			out = append(out, pid)
		}
	}
	return out
}

// boundLogs keeps envoy.out and envoy.log under MaxLogBytes (trimLog) every CheckInterval until
// ctx ends.
func (s *Supervisor) boundLogs(ctx context.Context) {
	t := time.NewTicker(s.cfg.CheckInterval)
	defer t.Stop()
	for {
		for _, name := range []string{"envoy.out", "envoy.log"} {
			p := filepath.Join(s.cfg.StateDir, name)
			if trimmed, err := trimLog(p, s.cfg.MaxLogBytes); err != nil {
				s.log.Error("bound envoy output file", "file", p, "err", err)
			} else if trimmed {
				s.log.Info("envoy output file reached its bound: copied to .1 and truncated", "file", p, "maxBytes", s.cfg.MaxLogBytes)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// trimLog copies path to path+".1" (replacing it) and truncates path when path is larger than
// max bytes ("copytruncate": Envoy keeps its file open with O_APPEND, so its next write lands at
// the new end). It reports whether it trimmed; a missing file is not an error. Lines written
// between the copy and the truncation are lost (at most the writes of that moment).
func trimLog(path string, max int64) (bool, error) {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) || (err == nil && st.Size() <= max) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	src, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer src.Close()
	dst, err := os.OpenFile(path+".1", os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return false, err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return false, fmt.Errorf("copy to %s.1: %w", path, err)
	}
	if err := dst.Close(); err != nil {
		return false, err
	}
	return true, os.Truncate(path, 0)
}
