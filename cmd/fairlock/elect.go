package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/election"
)

// electOptions are elect's own flags.
type electOptions struct {
	value            string
	wait, ttl, grace time.Duration
}

func (o *electOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.value, "value", "", "the `VALUE` this candidate leads with, shown by status (default host:pid,\nas status shows this process)")
	durationVar(fs, &o.wait, "w", 0, "give up campaigning after this long (exit 75; 70 if Redis did not answer); 0\nwaits forever")
	durationVar(fs, &o.ttl, "ttl", fairlock.DefaultLeaseTTL, "lease TTL: how long a crashed leader keeps leading")
	durationVar(fs, &o.grace, "grace", 10*time.Second, "after leadership is lost, or for what COMMAND leaves running, how long\nbetween SIGTERM and SIGKILL")
}

// electCmd is "fairlock elect": it campaigns and runs a command while it leads.
func electCmd(cmd *command, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet(cmd, stderr)
	c := common{stderr: stderr}
	c.register(fs)
	var o electOptions
	o.register(fs)
	name, command, code, ok := commandArgs(cmd, fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if !nonNegative(cmd, stderr, "w", o.wait) || !nonNegative(cmd, stderr, "grace", o.grace) ||
		!atMost(cmd, stderr, "ttl", o.ttl, fairlock.MaxTTL) {
		return exitUsage
	}
	valueSet := false
	fs.Visit(func(f *flag.Flag) { valueSet = valueSet || f.Name == "value" })
	if !valueSet {
		o.value = processLabel()
	}
	rdb, fc, err := c.connect(fairlock.WithLeaseTTL(o.ttl))
	if err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}
	defer c.flushLog() // last: what -v held back, after the clean-up's own logs
	defer rdb.Close()
	defer closeWithin(fc, closeWait)
	e, err := election.New(fc, name)
	if err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}

	// While campaigning, SIGINT and SIGTERM end the wait (leaving the queue).
	sigs := make(chan os.Signal, 4)
	notifyForwarded(sigs)
	defer signal.Stop(sigs)
	w := &waiter{fc: fc, name: name, elect: true, wait: o.wait, verbose: c.verbose, stderr: stderr,
		health: c.health, ping: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }}
	l, code := take(w, sigs, func(ctx context.Context) (*election.Leadership, error) {
		return e.Campaign(ctx, o.value)
	}, (*election.Leadership).Term)
	if l == nil {
		return code
	}

	// The command runs while the election's lease is held; FAIRLOCK_TOKEN
	// is the lease's token, which is the term.
	status := runUnder(l.Lease(), command, sigs, o.grace, stderr)
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	if err := l.Resign(rctx); err != nil && status != exitLeaseLost {
		fmt.Fprintln(stderr, errLine(err))
		if errors.Is(err, fairlock.ErrLeaseLost) {
			return exitLeaseLost
		}
	}
	return status
}
