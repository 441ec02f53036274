package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/election"
)

// electCmd is "fairlock elect": it campaigns and runs a command while it leads.
func electCmd(args []string, stderr io.Writer) int {
	fs := newFlagSet("elect", stderr)
	var c common
	c.register(fs, stderr)
	value := fs.String("value", "", "the value this candidate leads with, shown by status (default host:pid)")
	wait := fs.Duration("w", 0, "give up campaigning after this long (exit 75); 0 waits forever")
	ttl := fs.Duration("ttl", fairlock.DefaultLeaseTTL, "lease TTL: how long a crashed leader keeps leading")
	grace := fs.Duration("grace", 10*time.Second, "after leadership is lost, or for what COMMAND leaves running, how long between SIGTERM and SIGKILL")
	name, command, ok := commandArgs(fs, args, "elect", stderr)
	if !ok {
		return exitUsage
	}
	if *grace < 0 {
		fmt.Fprintf(stderr, "fairlock elect: -grace %v is negative\n", *grace)
		return exitUsage
	}
	rdb, fc, err := c.connect(fairlock.WithLeaseTTL(*ttl))
	if err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}
	defer rdb.Close()
	defer fc.Close()
	e, err := election.New(fc, name)
	if err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}
	if *value == "" {
		host, _ := os.Hostname()
		*value = fmt.Sprintf("%s:%d", host, os.Getpid())
	}

	// While campaigning, SIGINT and SIGTERM end the wait (leaving the queue).
	sigs := make(chan os.Signal, 4)
	notifyForwarded(sigs)
	defer signal.Stop(sigs)
	l, code := interruptible(sigs, *wait, stderr, func(ctx context.Context) (*election.Leadership, error) {
		return e.Campaign(ctx, *value)
	})
	if l == nil {
		return code
	}

	// The command runs while the election's lease is held; FAIRLOCK_TOKEN
	// is the lease's token, which is the term.
	status := runUnder(l.Lease(), command, sigs, *grace, stderr)
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
