package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fairlock/fairlock"
)

// forwarded are the signals run and elect pass on to COMMAND.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// notifyForwarded relays the forwarded signals to sigs, except those this
// process was started with ignored (by nohup, or by a shell for a
// background job): those stay ignored, and COMMAND inherits them so.
func notifyForwarded(sigs chan<- os.Signal) {
	for _, s := range forwarded {
		if !signal.Ignored(s) {
			signal.Notify(sigs, s)
		}
	}
}

// runUnder runs command while lease is held and returns the exit status:
// the command's own, or exitLeaseLost if the lease ended first.
//
// The command runs as a job (see startJob): the signals that arrive on
// sigs go to it (with a supervisor, to its process group as well). When
// the lease ends (lost, or at -max-hold) the job gets SIGTERM, and SIGKILL
// grace later if it still runs. runUnder returns once nothing of the job
// runs that the supervisor can see; only then may the caller release the
// lease.
func runUnder(lease *fairlock.Lease, command []string, sigs <-chan os.Signal, grace time.Duration, stderr io.Writer) int {
	env := append(os.Environ(),
		fmt.Sprintf("FAIRLOCK_TOKEN=%d", lease.Token()),
		"FAIRLOCK_NAME="+lease.Name())
	j, code := startJob(command, env, grace, stderr)
	if j == nil {
		return code
	}
	defer j.close()

	lost := false
	ended := lease.Done()
	var kill <-chan time.Time
	for {
		select {
		case <-j.done():
			if lost {
				return exitLeaseLost
			}
			return j.status(stderr)
		case s := <-sigs:
			j.signal(s)
		case <-ended:
			ended = nil // closed for good: selecting on it again would spin
			lost = true
			fmt.Fprintf(stderr, "%s; stopping %s\n", errLine(lease.Err()), command[0])
			j.signal(syscall.SIGTERM)
			t := time.NewTimer(grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			j.kill()
		}
	}
}

// exitStatus is the status fairlock exits with for a process that ended
// with ws: its exit code, or 128+N if signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if code := ps.ExitCode(); code >= 0 {
		return code
	}
	return exitError
}
