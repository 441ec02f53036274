//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"syscall"
	"time"
)

// superviseCmdName is the hidden command under which fairlock runs as the
// supervisor of a job (see job).
const superviseCmdName = "_supervise"

// superviseCmd is "fairlock _supervise GRACE -- COMMAND [ARGS...]", which
// run and elect start with the read end of their order pipe as fd 3.
// Started otherwise, it is no command.
func superviseCmd(args []string, stderr io.Writer) int {
	orders := os.NewFile(3, "orders")
	fi, err := orders.Stat()
	grace, gerr := time.Duration(0), errors.New("no grace")
	if len(args) > 0 {
		grace, gerr = time.ParseDuration(args[0])
	}
	if err != nil || fi.Mode()&os.ModeNamedPipe == 0 || gerr != nil || len(args) < 3 || args[1] != "--" {
		return unknownCommand(stderr, superviseCmdName)
	}
	syscall.CloseOnExec(3)
	// On Linux COMMAND gets SIGKILL when the thread that started it ends
	// (its parent-death signal), which need not be when the process ends:
	// Go ends a thread whose locked goroutine exits. The main goroutine,
	// locked to its thread here for good, starts COMMAND and returns only
	// to exit.
	runtime.LockOSThread()
	s := &supervisor{grace: grace}
	return s.run(orders, args[2:], stderr)
}

// A supervisor starts COMMAND and keeps it and every process it starts
// (the job) from running on without fairlock:
//
//   - It reads fairlock's orders: a byte is a signal to send to the job;
//     the pipe's end, whether fairlock closed it or died, is SIGKILL to
//     every process of the job, at once: the lease is no longer renewed,
//     and a SIGTERM and a grace could overrun what is left of it.
//   - Without a controlling terminal (cron, CI, a service) COMMAND gets a
//     process group of its own, whose id is the supervisor's pid (so it
//     cannot name another group while the supervisor lives), and signals
//     go to the whole group. In a terminal COMMAND stays in fairlock's
//     group, the shell's job, so that the terminal's job control works as
//     for any command (reading the terminal, Ctrl-C, Ctrl-Z); signals then
//     go to COMMAND and to the supervisor's other children.
//   - On Linux it is a child subreaper: a process of the job whose parent
//     exits (a daemon's double fork, setsid included) becomes its child, so
//     SIGKILL to its children until it has none reaches every process the
//     job started. It stays out of fairlock's process group, so that a
//     SIGKILL to that whole group (a CI runner's timeout) spares it to do
//     so. COMMAND's parent-death signal is SIGKILL: if the supervisor
//     itself is killed, COMMAND dies with it.
//   - When COMMAND exits, what it left behind gets SIGTERM, then SIGKILL
//     after grace; the supervisor exits with COMMAND's status once nothing
//     of the job runs, and only then does fairlock release the lease.
//
// All waiting for children, and every signal sent to a single pid, happen
// in one goroutine: a pid it signals is its unreaped child (or COMMAND
// before it is reaped), which the kernel cannot give to another process.
type supervisor struct {
	grace   time.Duration
	reaper  bool // a child subreaper (Linux)
	group   int  // the job's process group, or 0 if it is fairlock's
	inGroup bool // the supervisor is in group
	cpid    int  // COMMAND's pid, until reaped
	status  int  // COMMAND's exit status, once reaped; -1 before
	killing bool // SIGKILL to everything that is left
	none    bool // no child is left
}

func (s *supervisor) run(orders *os.File, command []string, stderr io.Writer) int {
	s.status = -1
	s.reaper = becomeSubreaper()
	// The forwarded signals, when sent to a group the supervisor is in,
	// are for COMMAND: the supervisor catches them (COMMAND starts with
	// them at their defaults) and sends on only what fairlock orders.
	// Those ignored from the start stay ignored, for COMMAND too.
	caught := make(chan os.Signal, 8)
	for _, sig := range forwarded {
		if !signal.Ignored(sig) {
			signal.Notify(caught, sig)
		}
	}
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)

	term := hasTerminal()
	fairlockGroup := syscall.Getpgrp()
	attr := &syscall.SysProcAttr{}
	parentDeathSignal(attr)
	if !term {
		if err := syscall.Setpgid(0, 0); err != nil {
			fmt.Fprintln(stderr, errLine(fmt.Errorf("cannot start %s: process group: %w", command[0], err)))
			return exitError
		}
		s.group, s.inGroup = os.Getpid(), true
		attr.Setpgid, attr.Pgid = true, s.group
	}
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitNoCommand
	}
	s.cpid = cmd.Process.Pid
	_ = cmd.Process.Release() // reaped below, with wait4
	switch {
	case s.reaper && term:
		_ = syscall.Setpgid(0, 0) // out of fairlock's group
	case !s.reaper && !term:
		// The group must be signalled whole, SIGKILL included, which the
		// supervisor must not be in.
		if syscall.Setpgid(0, fairlockGroup) == nil {
			s.inGroup = false
		}
	}

	ords := readOrders(orders)
	var leftover, poll <-chan time.Time
	for {
		s.reap()
		if s.status >= 0 && s.none && s.groupGone() {
			return s.status
		}
		if s.status >= 0 && !s.reaper && s.group != 0 && !s.inGroup && poll == nil {
			// Without a subreaper, what COMMAND left in its group is
			// not our child: its end is looked for.
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			poll = t.C
		}
		if s.status >= 0 && leftover == nil && !s.killing && s.leftovers() {
			s.signal(syscall.SIGTERM)
			t := time.NewTimer(s.grace)
			defer t.Stop()
			leftover = t.C
		}
		select {
		case <-chld:
		case b, ok := <-ords:
			if !ok {
				ords = nil
				s.kill()
				continue
			}
			if sig := syscall.Signal(b); slices.Contains(forwarded, os.Signal(sig)) {
				s.signal(sig)
			}
		case <-leftover:
			s.kill()
		case <-poll:
			if s.killing {
				s.sweep()
			}
		case <-caught:
		}
	}
}

// reap waits for every child that has ended, records COMMAND's status, and,
// while killing, kills the children that ended ones left to the supervisor.
func (s *supervisor) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.ECHILD):
			s.none = true
			return
		case err != nil || pid <= 0:
			if s.killing {
				s.sweep()
			}
			return
		}
		if pid == s.cpid {
			s.cpid = 0
			if ws.Signaled() {
				s.status = 128 + int(ws.Signal())
			} else {
				s.status = ws.ExitStatus()
			}
		}
	}
}

// kill starts killing: SIGKILL to every process of the job, and again to
// those that come to the supervisor as others end.
func (s *supervisor) kill() {
	s.killing = true
	s.sweep()
}

// sweep sends SIGKILL to every process of the job it can reach: the
// group (if the supervisor is not in it), COMMAND, and its children.
func (s *supervisor) sweep() {
	if s.group != 0 && !s.inGroup {
		_ = syscall.Kill(-s.group, syscall.SIGKILL)
	}
	if s.cpid != 0 {
		_ = syscall.Kill(s.cpid, syscall.SIGKILL)
	}
	for _, pid := range children() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// signal sends sig to the job: its group, or else COMMAND, and the
// supervisor's children outside the group.
func (s *supervisor) signal(sig syscall.Signal) {
	switch {
	case s.group != 0:
		_ = syscall.Kill(-s.group, sig)
	case s.cpid != 0:
		_ = syscall.Kill(s.cpid, sig)
	}
	for _, pid := range children() {
		if s.group == 0 && pid == s.cpid {
			continue
		}
		if pg, err := syscall.Getpgid(pid); s.group != 0 && err == nil && pg == s.group {
			continue
		}
		_ = syscall.Kill(pid, sig)
	}
}

// leftovers reports whether anything COMMAND started runs on after it,
// as far as the supervisor can see.
func (s *supervisor) leftovers() bool {
	switch {
	case s.reaper:
		return !s.none
	case s.group != 0 && !s.inGroup:
		return syscall.Kill(-s.group, 0) == nil
	}
	return false
}

// groupGone reports whether the job's group, when the supervisor must
// look for it, is empty.
func (s *supervisor) groupGone() bool {
	if s.reaper || s.group == 0 || s.inGroup {
		return true
	}
	return errors.Is(syscall.Kill(-s.group, 0), syscall.ESRCH)
}

// readOrders relays the bytes read from f, and closes the channel at its
// end.
func readOrders(f *os.File) <-chan byte {
	ch := make(chan byte)
	go func() {
		defer close(ch)
		b := make([]byte, 64)
		for {
			n, err := f.Read(b)
			for _, x := range b[:n] {
				ch <- x
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// hasTerminal reports whether the process has a controlling terminal.
func hasTerminal() bool {
	f, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}
