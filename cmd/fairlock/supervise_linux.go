package main

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER (Linux 3.4).
const prSetChildSubreaper = 36

// becomeSubreaper makes the process a child subreaper: an orphan among its
// descendants becomes its child rather than init's. It reports whether the
// kernel agreed.
func becomeSubreaper() bool {
	_, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0, 0, 0, 0)
	return e == 0
}

// parentDeathSignal has the kernel send SIGKILL to the child when the
// thread that starts it ends (see superviseCmd).
func parentDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

// children returns the pids of the process's children, ended ones not yet
// waited for included, from /proc.
func children() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	self := os.Getpid()
	var out []int
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) > 1 {
			if ppid, err := strconv.Atoi(string(f[1])); err == nil && ppid == self {
				out = append(out, pid)
			}
		}
	}
	return out
}

// self names this program's executable: /proc/self/exe runs the very file
// this process runs, even if it has been replaced or removed since.
func self() (string, error) {
	if _, err := os.Stat("/proc/self/exe"); err == nil {
		return "/proc/self/exe", nil
	}
	return os.Executable()
}
