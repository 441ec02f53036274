package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// proc is one process, named by its pid and its start time (so that a
// reused pid is not taken for it).
type proc struct {
	name  string
	pid   int
	start string
}

// procStat reads the state, parent, process group and start time of pid
// from /proc; ok is false when there is no such process.
func procStat(pid int) (state byte, ppid, pgrp int, start string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, "", false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, "", false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, 0, 0, "", false
	}
	ppid, _ = strconv.Atoi(f[1])
	pgrp, _ = strconv.Atoi(f[2])
	return f[0][0], ppid, pgrp, f[19], true
}

// alive reports whether p still runs: it exists, is the same process, and
// is neither a zombie nor dead.
func (p proc) alive() bool {
	state, _, _, start, ok := procStat(p.pid)
	return ok && start == p.start && state != 'Z' && state != 'X'
}

func (p proc) String() string { return fmt.Sprintf("%s (pid %d)", p.name, p.pid) }

// postmortem describes what the supervisors sups and the job's processes
// ps are doing: each one's state and parent, where in the kernel it
// sleeps (wchan), and, for a supervisor, its orders pipe (fd 3) and every
// process that holds that pipe open (a writer other than its fairlock
// would keep the pipe's end from coming).
func postmortem(sups []int, ps []proc) string {
	var b strings.Builder
	describe := func(name string, pid int) {
		state, ppid, pgrp, _, ok := procStat(pid)
		if !ok {
			fmt.Fprintf(&b, "%s (pid %d): gone\n", name, pid)
			return
		}
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
		fmt.Fprintf(&b, "%s (pid %d): state %c, parent %d, group %d, wchan %q\n", name, pid, state, ppid, pgrp, wchan)
	}
	for _, pid := range sups {
		describe("supervisor", pid)
		pipe, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/3", pid))
		if err != nil {
			fmt.Fprintf(&b, "  fd 3: %v\n", err)
			continue
		}
		fmt.Fprintf(&b, "  fd 3: %s, held by:", pipe)
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			fds, err := os.ReadDir("/proc/" + e.Name() + "/fd")
			if err != nil {
				continue
			}
			for _, fd := range fds {
				if l, _ := os.Readlink("/proc/" + e.Name() + "/fd/" + fd.Name()); l == pipe {
					fmt.Fprintf(&b, " pid %s fd %s", e.Name(), fd.Name())
				}
			}
		}
		b.WriteString("\n")
	}
	for _, p := range ps {
		describe(p.name, p.pid)
	}
	return b.String()
}

// procFile waits for file (in c.dir) to hold a pid and a newline, and
// returns that process.
func (c *cli) procFile(file string) proc {
	c.t.Helper()
	var p proc
	c.waitFor(file, func() bool {
		b, err := os.ReadFile(filepath.Join(c.dir, file))
		if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
			return false
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			c.t.Fatalf("%s holds %q", file, b)
		}
		_, _, _, start, ok := procStat(pid)
		p = proc{name: strings.TrimSuffix(file, ".pid"), pid: pid, start: start}
		return ok
	})
	return p
}

// reap kills ps at the test's end if they still run, so that a failing
// test leaves nothing behind.
func reap(t *testing.T, ps ...proc) {
	t.Cleanup(func() {
		for _, p := range ps {
			if p.alive() {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
		}
	})
}

// childrenOf returns the pids whose parent is pid.
func childrenOf(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, _, _, ok := procStat(n); ok && ppid == pid {
			out = append(out, n)
		}
	}
	return out
}

// openPTY opens a pseudo-terminal: the master, and the slave to give a
// process as its terminal.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		m.Close()
		t.Skipf("unlock pseudo-terminal: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		m.Close()
		t.Skipf("pseudo-terminal number: %v", e)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Skipf("open pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

// screen collects what a pseudo-terminal's master reads.
type screen struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func readScreen(m *os.File) *screen {
	s := &screen{}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := m.Read(b)
			s.mu.Lock()
			s.buf.Write(b[:n])
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return s
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// fairlockProc is a fairlock process under test, started either in a
// session of its own without a terminal, or as an interactive user starts
// it: by a shell that leads a session whose controlling terminal is a
// pseudo-terminal, in the shell's foreground process group.
type fairlockProc struct {
	c      *cli
	sub    string
	cmd    *exec.Cmd // fairlock, or the shell that runs it
	pid    int       // fairlock's
	term   bool
	master *os.File
	screen *screen
	stderr *os.File // fairlock's, when it runs without a terminal
}

var modes = []string{"no terminal", "terminal"}

func (c *cli) startIn(mode string, sub string, args ...string) *fairlockProc {
	c.t.Helper()
	f := &fairlockProc{c: c, sub: sub, term: mode == "terminal"}
	cmd := c.cmd(sub, args...)
	if !f.term {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		// A file, not a pipe: a process that outlives fairlock and
		// holds the pipe would keep cmd.Wait waiting.
		var err error
		if f.stderr, err = os.CreateTemp(c.dir, "stderr"); err != nil {
			c.t.Fatal(err)
		}
		cmd.Stderr = f.stderr
		if err := cmd.Start(); err != nil {
			c.t.Fatal(err)
		}
		f.cmd, f.pid = cmd, cmd.Process.Pid
		return f
	}
	m, s := openPTY(c.t)
	f.master, f.screen = m, readScreen(m)
	// The shell stays, reading the terminal, until the test ends: a
	// session leader that exits sends SIGHUP to the foreground job, which
	// would take down what fairlock left behind and hide it from a test.
	sh := exec.Command("sh", append([]string{"-c", `"$@"; echo $? > fairlock.rc.new; mv fairlock.rc.new fairlock.rc; read _`, "sh"}, cmd.Args...)...)
	sh.Dir = c.dir
	sh.Stdin, sh.Stdout, sh.Stderr = s, s, s
	sh.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := sh.Start(); err != nil {
		c.t.Fatal(err)
	}
	f.cmd = sh
	c.t.Cleanup(func() {
		_ = sh.Process.Kill()
		_ = sh.Wait()
	})
	c.waitFor("the shell to start fairlock", func() bool {
		kids := childrenOf(sh.Process.Pid)
		if len(kids) == 1 {
			f.pid = kids[0]
		}
		return len(kids) == 1
	})
	// A test that fails may leave fairlock running: killing it has its
	// supervisor take the rest down.
	_, _, _, start, _ := procStat(f.pid)
	reap(c.t, proc{name: "fairlock", pid: f.pid, start: start})
	return f
}

// wait waits for fairlock to exit and returns its status (in a terminal,
// as the shell that ran it saw it).
func (f *fairlockProc) wait() int {
	f.c.t.Helper()
	if !f.term {
		return exitOf(f.cmd.Wait())
	}
	rc := filepath.Join(f.c.dir, "fairlock.rc")
	deadline := time.Now().Add(time.Minute)
	for {
		if b, err := os.ReadFile(rc); err == nil {
			n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			return n
		}
		if time.Now().After(deadline) {
			ps, _ := exec.Command("ps", "-eo", "pid,ppid,pgid,sid,stat,args").Output()
			f.c.t.Fatalf("fairlock (pid %d) still runs after a minute; terminal:\n%s\nprocesses:\n%s", f.pid, f.output(), ps)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *fairlockProc) output() string {
	if f.term {
		return f.screen.String()
	}
	b, _ := os.ReadFile(f.stderr.Name())
	return string(b)
}

// syncBuffer is a bytes.Buffer that a process writes while a test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
