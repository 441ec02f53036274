package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/election"
)

// statusCmd is "fairlock status": it prints semaphores' holders and waiters.
func statusCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("status", stderr)
	var c common
	c.register(fs, stderr)
	asJSON := fs.Bool("json", false, "print JSON: one object per NAME, in an array")
	watch := fs.Duration("watch", 0, "refresh at this interval until interrupted (0: print once)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	names := fs.Args()
	if len(names) == 0 {
		fmt.Fprintln(stderr, "fairlock status: want at least one NAME")
		return exitUsage
	}
	rdb, fc, err := c.connect()
	if err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}
	defer rdb.Close()
	defer fc.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	for {
		var all []status
		for _, name := range names {
			st, err := readStatus(ctx, fc, name)
			if err != nil {
				if ctx.Err() != nil {
					return 0
				}
				fmt.Fprintln(stderr, errLine(err))
				return exitError
			}
			all = append(all, st)
		}
		if *watch > 0 && !*asJSON {
			fmt.Fprint(stdout, "\033[H\033[2J") // clear the screen
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			if err := enc.Encode(all); err != nil {
				fmt.Fprintln(stderr, errLine(err))
				return exitError
			}
		} else {
			printTable(stdout, all)
		}
		if *watch <= 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(*watch):
		}
	}
}

// status is what status prints of one NAME: the semaphore's Status and,
// if NAME is an election with a leader, the leader.
type status struct {
	fairlock.Status
	Leader *election.Info `json:"leader,omitempty"`
}

func readStatus(ctx context.Context, fc *fairlock.Client, name string) (status, error) {
	st, err := fc.Status(ctx, name)
	if err != nil || len(st.Holders) != 1 {
		return status{Status: st}, err
	}
	e, err := election.New(fc, name)
	if err != nil {
		return status{Status: st}, err
	}
	info, err := e.Leader(ctx)
	switch {
	case errors.Is(err, election.ErrNoLeader):
		return status{Status: st}, nil
	case err != nil:
		return status{Status: st}, err
	}
	return status{Status: st, Leader: &info}, nil
}

func printTable(w io.Writer, all []status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, st := range all {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		if st.Capacity == 0 {
			fmt.Fprintf(tw, "%s: idle\n", st.Name)
			continue
		}
		fmt.Fprintf(tw, "%s: %d of %d permits held, %d waiting", st.Name, st.InUse, st.Capacity, st.Queued)
		if st.Queued > 0 {
			fmt.Fprintf(tw, ", the oldest for %v", st.OldestWait.Round(time.Millisecond))
		}
		fmt.Fprintln(tw)
		if st.Leader != nil {
			fmt.Fprintf(tw, "  leader %s, term %d\n", st.Leader.Value, st.Leader.Term)
		}
		if len(st.Holders) > 0 {
			fmt.Fprintln(tw, "  HOLDER\tPERMITS\tTOKEN\tHELD FOR\tEXPIRES IN\t")
			for _, h := range st.Holders {
				fmt.Fprintf(tw, "  %s\t%d\t%d\t%v\t%v\t\n", h.Owner, h.Permits, h.Token, h.HeldFor.Round(time.Millisecond), h.ExpiresIn)
			}
		}
		if len(st.Waiters) > 0 {
			fmt.Fprintln(tw, "  POSITION\tWAITER\tPERMITS\tWAITING SINCE\t")
			for j, wt := range st.Waiters {
				fmt.Fprintf(tw, "  %d\t%s\t%d\t%s\t\n", j+1, wt.Owner, wt.Permits, wt.Since.Format(time.RFC3339Nano))
			}
		}
	}
	tw.Flush()
}
