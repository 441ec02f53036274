package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/engine"
)

// runCmd is "fairlock run": it runs a command while it holds a lease.
func runCmd(args []string, stderr io.Writer) int {
	fs := newFlagSet("run", stderr)
	var c common
	c.register(fs, stderr)
	capacity := fs.Int64("capacity", 1, "how many permits NAME has; 1 makes it a mutex")
	permits := fs.Int64("permits", 1, "how many permits COMMAND takes")
	wait := fs.Duration("w", 0, "give up waiting after this long (exit 75); 0 waits forever")
	nowait := fs.Bool("n", false, "do not wait: exit 75 at once if NAME is busy")
	ttl := fs.Duration("ttl", fairlock.DefaultLeaseTTL, "lease TTL: how long a crashed fairlock keeps the lock")
	grace := fs.Duration("grace", 10*time.Second, "after a lost lease, or for what COMMAND leaves running, how long between SIGTERM and SIGKILL")
	maxHold := fs.Duration("max-hold", 0, "end the lease this long after the grant even if COMMAND still runs (SIGTERM, exit 76); 0: no cap")
	name, command, ok := commandArgs(fs, args, "run", stderr)
	if !ok {
		return exitUsage
	}
	if *grace < 0 {
		fmt.Fprintf(stderr, "fairlock run: -grace %v is negative\n", *grace)
		return exitUsage
	}

	rdb, fc, err := c.connect(fairlock.WithLeaseTTL(*ttl), fairlock.WithMaxHold(*maxHold))
	if err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}
	defer rdb.Close()
	defer fc.Close()
	req := fairlock.Request{Name: name, Capacity: *capacity, Permits: *permits}
	if err := engine.Validate(fc, req); err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}

	// While waiting, SIGINT and SIGTERM end the wait (leaving the queue).
	sigs := make(chan os.Signal, 4)
	notifyForwarded(sigs)
	defer signal.Stop(sigs)
	lease, code := interruptible(sigs, *wait, stderr, func(ctx context.Context) (*fairlock.Lease, error) {
		if *nowait {
			return fc.TryAcquire(ctx, req)
		}
		return fc.Acquire(ctx, req)
	})
	if lease == nil {
		return code
	}

	status := runUnder(lease, command, sigs, *grace, stderr)
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	if err := lease.Release(rctx); err != nil && status != exitLeaseLost {
		if errors.Is(err, fairlock.ErrLeaseLost) {
			fmt.Fprintln(stderr, errLine(err))
			return exitLeaseLost
		}
		fmt.Fprintln(stderr, errLine(err))
	}
	return status
}

// commandArgs parses fs's flags from args and splits what follows into
// NAME -- COMMAND [ARGS...]; it prints a usage line and returns ok false
// when they do not fit.
func commandArgs(fs *flag.FlagSet, args []string, verb string, stderr io.Writer) (name string, command []string, ok bool) {
	if err := fs.Parse(args); err != nil {
		return "", nil, false
	}
	rest := fs.Args()
	if len(rest) < 3 || rest[1] != "--" {
		fmt.Fprintf(stderr, "fairlock %s: want NAME -- COMMAND [ARGS...]\n", verb)
		return "", nil, false
	}
	return rest[0], rest[2:], true
}

// interruptible runs take (an Acquire or a Campaign) with a context that
// ends after wait (if > 0) or when a signal arrives on sigs. It returns
// what take got, or nil and the exit status: exitNotGot when the wait ran
// out or the permits were busy (TryAcquire), 128+signal when a signal ended
// it, exitUsage for a bad argument, exitError otherwise.
func interruptible[T any](sigs <-chan os.Signal, wait time.Duration, stderr io.Writer, take func(context.Context) (*T, error)) (*T, int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if wait > 0 {
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	var interrupted os.Signal
	stopWatch, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case s := <-sigs:
			interrupted = s
			cancel()
		case <-stopWatch:
		}
	}()
	got, err := take(ctx)
	close(stopWatch)
	<-watched
	switch {
	case err == nil:
		return got, 0
	case errors.Is(err, fairlock.ErrInvalidArgument):
		fmt.Fprintln(stderr, errLine(err))
		return nil, exitUsage
	case errors.Is(err, fairlock.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded):
		return nil, exitNotGot
	case errors.Is(err, context.Canceled) && interrupted != nil:
		return nil, 128 + int(interrupted.(syscall.Signal))
	default:
		fmt.Fprintln(stderr, errLine(err))
		return nil, exitError
	}
}
