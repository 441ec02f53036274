//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// A job is COMMAND under a supervisor: fairlock does not start COMMAND
// itself but a second fairlock process ("fairlock _supervise GRACE --
// COMMAND...", see supervise) that starts it, holds it and what it starts,
// and exits with its status once all of them are gone. fairlock gives the
// supervisor its orders through a pipe: one byte per signal to send to the
// job; the pipe's end, whether fairlock closed it or died (SIGKILL, the
// OOM killer, a crash), orders SIGKILL to everything. So the command (and,
// on Linux, everything it started) never runs on after the fairlock that
// holds its lease.
type job struct {
	proc   *exec.Cmd // the supervisor
	name   string    // the command's
	orders *os.File
	exited chan struct{}
}

// startJob starts the supervisor with command, env and grace. On failure it
// prints why and returns nil and the exit status.
func startJob(command, env []string, grace time.Duration, stderr io.Writer) (*job, int) {
	exe, err := self()
	if err != nil {
		fmt.Fprintln(stderr, errLine(fmt.Errorf("cannot start %s: %w", command[0], err)))
		return nil, exitError
	}
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Fprintln(stderr, errLine(fmt.Errorf("cannot start %s: %w", command[0], err)))
		return nil, exitError
	}
	defer r.Close()
	p := exec.Command(exe, append([]string{superviseCmdName, grace.String(), "--"}, command...)...)
	p.Args[0] = os.Args[0]
	p.Stdin, p.Stdout, p.Stderr = os.Stdin, os.Stdout, os.Stderr
	p.Env = env
	p.ExtraFiles = []*os.File{r} // its fd 3; w is close-on-exec, so only fairlock holds it
	if err := p.Start(); err != nil {
		w.Close()
		fmt.Fprintln(stderr, errLine(fmt.Errorf("cannot start %s: %w", command[0], err)))
		return nil, exitError
	}
	j := &job{proc: p, name: command[0], orders: w, exited: make(chan struct{})}
	go func() {
		_ = p.Wait()
		close(j.exited)
	}()
	return j, 0
}

func (j *job) done() <-chan struct{} { return j.exited }

// signal has the supervisor send s to the job. A write after the
// supervisor's exit fails (EPIPE), harmlessly.
func (j *job) signal(s os.Signal) {
	if n, ok := s.(syscall.Signal); ok && n > 0 && n < 256 {
		_, _ = j.orders.Write([]byte{byte(n)})
	}
}

// kill has the supervisor kill the job (SIGKILL to every process of it).
func (j *job) kill() { _ = j.orders.Close() }

func (j *job) close() { _ = j.orders.Close() }

// status is the job's exit status, once done: the supervisor exits with
// the command's. A supervisor killed by a signal took the command along
// (see supervise); that is reported.
func (j *job) status(stderr io.Writer) int {
	ps := j.proc.ProcessState
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		fmt.Fprintf(stderr, "fairlock: the supervisor of %s ended by signal %d (%v)\n", j.name, int(ws.Signal()), ws.Signal())
	}
	return exitStatus(ps)
}
