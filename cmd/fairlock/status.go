package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/barrier"
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/internal/engine"
	"github.com/fairlock/fairlock/latch"
)

// statusOptions are status's own flags.
type statusOptions struct {
	json  bool
	watch time.Duration
	kind  string
}

// statusKinds are what -kind accepts: the kinds of object NAME names.
var statusKinds = []string{"semaphore", "latch", "barrier"}

func (o *statusOptions) register(fs *flag.FlagSet) {
	fs.BoolVar(&o.json, "json", false, "print JSON: one object per NAME, in an array")
	fs.StringVar(&o.kind, "kind", "semaphore", "what each NAME is: semaphore (a mutex, a read-write mutex, an election), latch or\nbarrier (a latch or a barrier of a name shares no key with its semaphore)")
	durationVar(fs, &o.watch, "watch", 0, "print again at this interval until interrupted, riding out Redis failures\n(0: print once)")
}

// statusCmd is "fairlock status": it prints semaphores' holders and waiters.
func statusCmd(cmd *command, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet(cmd, stderr)
	c := common{stderr: stderr}
	c.register(fs)
	var o statusOptions
	o.register(fs)
	if code, ok := cmd.parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if !nonNegative(cmd, stderr, "watch", o.watch) {
		return exitUsage
	}
	if !slices.Contains(statusKinds, o.kind) {
		fmt.Fprintf(stderr, "fairlock status: -kind %q: want one of %s\n", o.kind, strings.Join(statusKinds, ", "))
		return cmd.usageError(stderr)
	}
	names := fs.Args()
	if len(names) == 0 {
		fmt.Fprintln(stderr, "fairlock status: want at least one NAME")
		return cmd.usageError(stderr)
	}
	if i := len(args) - len(names); i == 0 || args[i-1] != "--" {
		for _, n := range names {
			if strings.HasPrefix(n, "-") && n != "-" {
				fmt.Fprintf(stderr, "fairlock status: %s after NAME: flags go before NAME (and -- before a NAME that starts with -)\n", n)
				return cmd.usageError(stderr)
			}
		}
	}
	rdb, fc, err := c.connect()
	if err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}
	defer c.flushLog() // last: what -v held back, after the clean-up's own logs
	defer rdb.Close()
	defer closeWithin(fc, closeWait)
	for _, name := range names {
		if err := engine.Validate(fc, fairlock.Request{Name: name, Capacity: 1, Permits: 1}); err != nil {
			fmt.Fprintln(stderr, errLine(err))
			return exitUsage
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if o.watch == 0 {
		all, err := readAll(ctx, fc, o.kind, names)
		if err != nil {
			if ctx.Err() != nil {
				return 0
			}
			fmt.Fprintln(stderr, errLine(err))
			return exitError
		}
		if err := printStatus(stdout, all, o.json); err != nil {
			fmt.Fprintln(stderr, errLine(err))
			return exitError
		}
		return 0
	}
	return watchStatus(ctx, fc, o.kind, names, o.watch, o.json, stdout, stderr)
}

// watchStatus prints the status of names every interval until ctx ends
// (status 0). On a terminal each table replaces the last. A failed read
// (Redis restarting, unreachable, or slow past max(interval, 5s)) is said
// on stderr, each time on a terminal, once per outage off one, and the
// next round tries again.
func watchStatus(ctx context.Context, fc *fairlock.Client, kind string, names []string, interval time.Duration, asJSON bool, stdout, stderr io.Writer) int {
	term := !asJSON && isTerminal(stdout)
	var down time.Time // when reads began to fail; zero while they work
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, max(interval, 5*time.Second))
		all, err := readAll(rctx, fc, kind, names)
		cancel()
		switch {
		case ctx.Err() != nil:
			return 0
		case err != nil:
			if term {
				fmt.Fprint(stdout, clearScreen)
			}
			if term || down.IsZero() {
				what := "cannot reach Redis"
				if !unreachable(err) {
					what = "Redis did not give the status"
				}
				if !down.IsZero() {
					what += " since " + down.Format(time.TimeOnly)
				}
				detail := strings.Replace(strings.TrimPrefix(errLine(err), "fairlock: "), "cannot reach Redis: ", "", 1)
				fmt.Fprintf(stderr, "fairlock: %s, trying again every %v: %s\n", what, interval, detail)
			}
			if down.IsZero() {
				down = time.Now()
			}
		default:
			down = time.Time{}
			if term {
				fmt.Fprint(stdout, clearScreen)
			}
			if err := printStatus(stdout, all, asJSON); err != nil {
				fmt.Fprintln(stderr, errLine(err))
				return exitError
			}
		}
		t.Reset(interval)
	}
}

// unreachable reports whether err says Redis could not be reached or did
// not answer in time (rather than answering with an error).
func unreachable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// clearScreen moves a terminal's cursor home and clears the screen.
const clearScreen = "\033[H\033[2J"

// isTerminal reports whether w is a terminal (a character device: a
// terminal, or /dev/null, where clearing costs nothing).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// readAll reads the status of each of names, objects of kind.
func readAll(ctx context.Context, fc *fairlock.Client, kind string, names []string) ([]entry, error) {
	var all []entry
	for _, name := range names {
		var st entry
		var err error
		switch kind {
		case "latch":
			var ls latch.Status
			ls, err = latch.Inspect(ctx, fc, name)
			st = latchStatus{Name: name, Kind: kind, Status: ls}
		case "barrier":
			var bs barrier.Status
			bs, err = barrier.Inspect(ctx, fc, name)
			st = barrierStatus{Name: name, Kind: kind, Status: bs}
		default:
			st, err = readStatus(ctx, fc, name)
		}
		if err != nil {
			return nil, err
		}
		all = append(all, st)
	}
	return all, nil
}

func printStatus(w io.Writer, all []entry, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(all)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, st := range all {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		st.table(tw)
	}
	return tw.Flush()
}

// An entry is what status prints of one NAME: a table, or an object of
// the JSON array.
type entry interface {
	table(w io.Writer)
}

// status is what status prints of a semaphore: its Status and, if NAME
// is an election with a leader, the leader.
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

func (st status) table(tw io.Writer) {
	if st.Capacity == 0 {
		fmt.Fprintf(tw, "%s: idle\n", st.Name)
		return
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
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%v\t%v\t\n", who(h.Owner), h.Permits, h.Token, h.HeldFor.Round(time.Millisecond), h.ExpiresIn)
		}
	}
	if len(st.Waiters) > 0 {
		fmt.Fprintln(tw, "  POSITION\tWAITER\tPERMITS\tWAITING FOR\t")
		for j, wt := range st.Waiters {
			fmt.Fprintf(tw, "  %d\t%s\t%d\t%v\t\n", j+1, who(wt.Owner), wt.Permits, max(st.Time.Sub(wt.Since), 0).Round(time.Millisecond))
		}
	}
}

// latchStatus is what status -kind latch prints of NAME.
type latchStatus struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	latch.Status
}

func (st latchStatus) table(tw io.Writer) {
	switch {
	case !st.Exists:
		fmt.Fprintf(tw, "%s: no latch\n", st.Name)
	case st.Count == 0:
		fmt.Fprintf(tw, "%s: latch open (counted down from %d), %d waiting\n", st.Name, st.Initial, st.Waiting)
	default:
		fmt.Fprintf(tw, "%s: latch at %d of %d, %d waiting\n", st.Name, st.Count, st.Initial, st.Waiting)
	}
}

// barrierStatus is what status -kind barrier prints of NAME.
type barrierStatus struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	barrier.Status
}

func (st barrierStatus) table(tw io.Writer) {
	if st.Parties == 0 {
		fmt.Fprintf(tw, "%s: no barrier\n", st.Name)
		return
	}
	fmt.Fprintf(tw, "%s: barrier of %d parties, round %d, %d arrived", st.Name, st.Parties, st.Round, len(st.Arrived))
	if st.Broken {
		fmt.Fprint(tw, ", broken (a party left or died: the round breaks for all)")
	}
	fmt.Fprintln(tw)
	if len(st.Arrived) > 0 {
		fmt.Fprintln(tw, "  INDEX\tPARTY\t")
		for j, p := range st.Arrived {
			fmt.Fprintf(tw, "  %d\t%s\t\n", j, who(p))
		}
	}
}

// who is how the status table shows a holder's or a waiter's owner (see
// fairlock.Holder): its label as it is (host:pid for fairlock's own
// processes); a client without a label, whose owner is its whole client
// id, by the id's first 8 characters and an ellipsis. -json keeps the
// owner whole.
func who(owner string) string {
	if isClientID(owner) {
		return owner[:8] + "…"
	}
	return owner
}

// isClientID reports whether owner has the form of the id of a client
// without a label: 26 characters of base32 (rand.Text).
func isClientID(owner string) bool {
	if len(owner) != 26 {
		return false
	}
	for _, r := range owner {
		if !('A' <= r && r <= 'Z' || '2' <= r && r <= '7') {
			return false
		}
	}
	return true
}
