package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/engine"
)

// runOptions are run's own flags.
type runOptions struct {
	capacity, permits         int64
	wait, ttl, grace, maxHold time.Duration
	nowait                    bool
}

func (o *runOptions) register(fs *flag.FlagSet) {
	fs.Int64Var(&o.capacity, "capacity", 1, "how many permits NAME has; 1 makes it a mutex")
	fs.Int64Var(&o.permits, "permits", 1, "how many permits COMMAND takes")
	durationVar(fs, &o.wait, "w", 0, "give up waiting after this long (exit 75; 70 if Redis did not answer); 0 waits\nforever")
	fs.BoolVar(&o.nowait, "n", false, "do not wait: exit 75 at once if NAME is busy")
	durationVar(fs, &o.ttl, "ttl", fairlock.DefaultLeaseTTL, "lease TTL: how long a crashed fairlock keeps the lock")
	durationVar(fs, &o.grace, "grace", 10*time.Second, "after a lost lease, or for what COMMAND leaves running, how long between\nSIGTERM and SIGKILL")
	durationVar(fs, &o.maxHold, "max-hold", 0, "end the lease this long after the grant even if COMMAND still runs\n(SIGTERM, exit 76); 0: no cap")
}

// runCmd is "fairlock run": it runs a command while it holds a lease.
func runCmd(cmd *command, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet(cmd, stderr)
	c := common{stderr: stderr}
	c.register(fs)
	var o runOptions
	o.register(fs)
	name, command, code, ok := commandArgs(cmd, fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if !nonNegative(cmd, stderr, "w", o.wait) || !nonNegative(cmd, stderr, "grace", o.grace) ||
		!atMost(cmd, stderr, "ttl", o.ttl, fairlock.MaxTTL) || !atMost(cmd, stderr, "max-hold", o.maxHold, fairlock.MaxHoldLimit) {
		return exitUsage
	}

	rdb, fc, err := c.connect(fairlock.WithLeaseTTL(o.ttl), fairlock.WithMaxHold(o.maxHold))
	if err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}
	defer c.flushLog() // last: what -v held back, after the clean-up's own logs
	defer rdb.Close()
	defer closeWithin(fc, closeWait)
	req := fairlock.Request{Name: name, Capacity: o.capacity, Permits: o.permits}
	if err := engine.Validate(fc, req); err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}

	// While waiting, SIGINT and SIGTERM end the wait (leaving the queue).
	sigs := make(chan os.Signal, 4)
	notifyForwarded(sigs)
	defer signal.Stop(sigs)
	w := &waiter{fc: fc, name: name, nowait: o.nowait, wait: o.wait, verbose: c.verbose, stderr: stderr,
		health: c.health, ping: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }}
	lease, code := take(w, sigs, func(ctx context.Context) (*fairlock.Lease, error) {
		if o.nowait {
			return fc.TryAcquire(ctx, req)
		}
		return fc.Acquire(ctx, req)
	}, (*fairlock.Lease).Token)
	if lease == nil {
		return code
	}

	status := runUnder(lease, command, sigs, o.grace, stderr)
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

// closeWait bounds how long run, elect and status wait for their client's
// clean-up as they exit (see closeWithin).
const closeWait = 500 * time.Millisecond

// commandArgs parses fs's flags from args and splits what follows into
// NAME -- COMMAND [ARGS...]. When they do not fit, or with -h, it says so
// and returns the exit status and ok false.
func commandArgs(cmd *command, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (name string, command []string, code int, ok bool) {
	if code, ok := cmd.parse(fs, args, stdout, stderr); !ok {
		return "", nil, code, false
	}
	rest := fs.Args()
	switch {
	case len(rest) >= 2 && rest[1] != "--" && strings.HasPrefix(rest[1], "-") && rest[1] != "-":
		fmt.Fprintf(stderr, "fairlock %s: %s after NAME: flags go before NAME\n", cmd.name, rest[1])
	case len(rest) < 3 || rest[1] != "--":
		fmt.Fprintf(stderr, "fairlock %s: want NAME -- COMMAND [ARGS...]\n", cmd.name)
	default:
		return rest[0], rest[2:], 0, true
	}
	return "", nil, cmd.usageError(stderr), false
}
