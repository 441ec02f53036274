//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"
)

// A job is COMMAND, started directly: on Windows (and the Unix systems
// without the supervisor: AIX, Solaris, illumos) signals go to COMMAND
// alone, and if fairlock is killed COMMAND runs on.
type job struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func startJob(command, env []string, grace time.Duration, stderr io.Writer) (*job, int) {
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return nil, exitNoCommand
	}
	j := &job{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(j.exited)
	}()
	return j, 0
}

func (j *job) done() <-chan struct{}       { return j.exited }
func (j *job) signal(s os.Signal)          { _ = j.cmd.Process.Signal(s) }
func (j *job) kill()                       { _ = j.cmd.Process.Kill() }
func (j *job) close()                      {}
func (j *job) status(stderr io.Writer) int { return exitStatus(j.cmd.ProcessState) }

const superviseCmdName = "_supervise"

// superviseCmd is no command here.
func superviseCmd(args []string, stderr io.Writer) int {
	return unknownCommand(stderr, superviseCmdName)
}
