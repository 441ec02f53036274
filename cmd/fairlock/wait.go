package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fairlock/fairlock"
)

// A waiter is run's or elect's wait for NAME, and what it says of it.
type waiter struct {
	fc      *fairlock.Client
	name    string
	elect   bool          // a campaign: "to lead", rather than "for"
	nowait  bool          // -n: TryAcquire, no wait
	wait    time.Duration // -w: give up after this long; 0 waits forever
	verbose bool          // -v: say how long it waits, and when it got NAME
	stderr  io.Writer
	health  *redisHealth                // whether Redis answered while it waited
	ping    func(context.Context) error // asks Redis whether it answers
}

// Progress lines of -v: the first once the waiter is seen in the queue
// (looked for every firstLook, at most for firstLine), then every
// progressPoll if its place changed, else after growing intervals, from
// progressFirst to progressMax.
const (
	firstLook     = 100 * time.Millisecond
	firstLine     = time.Second
	progressPoll  = time.Second
	progressFirst = 2 * time.Second
	progressMax   = 30 * time.Second
)

// take runs get (an Acquire or a Campaign) with a context that ends after
// w.wait (if > 0) or when a signal arrives on sigs. It returns what get
// got, or nil and the exit status: exitNotGot when NAME was busy
// (TryAcquire) or the wait ran out with Redis answering, saying why on
// stderr; exitError when the wait ran out and Redis had not answered
// (saying so, with its address); 128+signal when a
// signal ended it; exitUsage for a bad argument; exitError otherwise. With
// -v it says, while get waits, how long it has and its place in line, and
// what it got (token, the term of an election, given by token).
func take[T any](w *waiter, sigs <-chan os.Signal, get func(context.Context) (*T, error), token func(*T) int64) (*T, int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if w.wait > 0 {
		ctx, cancel = context.WithTimeout(ctx, w.wait)
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
	start := time.Now()
	stopProgress, progressed := func() {}, make(chan struct{})
	if w.verbose && !w.nowait {
		var pctx context.Context
		pctx, stopProgress = context.WithCancel(ctx)
		go func() {
			defer close(progressed)
			w.progress(pctx, start)
		}()
	} else {
		close(progressed)
	}
	got, err := get(ctx)
	stopProgress()
	<-progressed
	close(stopWatch)
	<-watched
	switch {
	case err == nil:
		if w.verbose {
			if w.elect {
				fmt.Fprintf(w.stderr, "fairlock: leading %q after %s (term %d)\n", w.name, waited(time.Since(start)), token(got))
			} else {
				fmt.Fprintf(w.stderr, "fairlock: got %q after %s (token %d)\n", w.name, waited(time.Since(start)), token(got))
			}
		}
		return got, 0
	case errors.Is(err, fairlock.ErrInvalidArgument):
		fmt.Fprintln(w.stderr, errLine(err))
		return nil, exitUsage
	case errors.Is(err, context.DeadlineExceeded):
		// The wait ran out: NAME was busy only if Redis answered all along.
		if trouble := w.health.troubleSince(start, w.ping); trouble != nil {
			what := "for"
			if w.elect {
				what = "to lead"
			}
			fmt.Fprintf(w.stderr, "fairlock: waited %v %s %q, but %v; not a busy lock\n", w.wait, what, w.name, trouble)
			return nil, exitError
		}
		w.notGot()
		return nil, exitNotGot
	case errors.Is(err, fairlock.ErrNotAcquired):
		w.notGot()
		return nil, exitNotGot
	case errors.Is(err, context.Canceled) && interrupted != nil:
		return nil, 128 + int(interrupted.(syscall.Signal))
	default:
		fmt.Fprintln(w.stderr, errLine(err))
		return nil, exitError
	}
}

// notGot says on stderr why NAME was not got: busy (-n), or the wait ran
// out (-w); and who holds it, as far as Redis says within half a second.
func (w *waiter) notGot() {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var b blockers
	if st, err := readStatus(ctx, w.fc, w.name); err == nil {
		b = blockersOf(st)
	}
	if w.nowait {
		switch {
		case b.by != "" && b.waiting > 0:
			fmt.Fprintf(w.stderr, "fairlock: %q is %s (by %s), %d waiting; not waiting (-n)\n", w.name, b.verb, b.by, b.waiting)
		case b.by != "":
			fmt.Fprintf(w.stderr, "fairlock: %q is %s (by %s); not waiting (-n)\n", w.name, b.verb, b.by)
		case b.waiting > 0:
			fmt.Fprintf(w.stderr, "fairlock: %q is busy (%d waiting); not waiting (-n)\n", w.name, b.waiting)
		default:
			fmt.Fprintf(w.stderr, "fairlock: %q is busy; not waiting (-n)\n", w.name)
		}
		return
	}
	what := "for"
	if w.elect {
		what = "to lead"
	}
	var why []string
	if b.by != "" {
		why = append(why, b.verb+" by "+b.by)
	}
	if b.waiting > 0 {
		why = append(why, fmt.Sprintf("%d waiting", b.waiting))
	}
	paren := ""
	if len(why) > 0 {
		paren = " (" + strings.Join(why, ", ") + ")"
	}
	fmt.Fprintf(w.stderr, "fairlock: waited %v %s %q%s; giving up (-w)\n", w.wait, what, w.name, paren)
}

// blockers are who keep this process from NAME.
type blockers struct {
	verb    string // "held", or "led" for an election with a leader
	by      string // the holders ("a, b and 2 more"), or the leader's value
	waiting int64  // the other waiters
}

// blockersOf reads who keeps this process from NAME in st.
func blockersOf(st status) blockers {
	var b blockers
	switch {
	case st.Leader != nil:
		b.verb, b.by = "led", st.Leader.Value
	case len(st.Holders) > 0:
		var names []string
		for _, h := range st.Holders {
			if n := who(h.Owner); !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
		if len(names) > 3 {
			names = append(names[:3:3], fmt.Sprintf("%d more", len(names)-3))
		}
		b.verb = "held"
		b.by = strings.Join(names, ", ")
		if i := strings.LastIndex(b.by, ", "); i >= 0 {
			b.by = b.by[:i] + " and " + b.by[i+2:]
		}
	}
	b.waiting = st.Queued
	label := processLabel()
	for _, wt := range st.Waiters {
		if wt.Owner == label {
			b.waiting-- // this process's own waiter, not yet withdrawn
		}
	}
	return b
}

// progress prints -v's lines while the wait lasts (until ctx ends): one
// once this process's waiter shows in NAME's queue (or after firstLine
// without it), then one whenever its place changes and after intervals
// growing from progressFirst to progressMax.
func (w *waiter) progress(ctx context.Context, start time.Time) {
	t := time.NewTimer(firstLook)
	defer t.Stop()
	label := processLabel()
	var last time.Time // when the last line was printed; zero before the first
	var lastPlace string
	every := progressFirst
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, progressPoll)
		st, err := w.fc.Status(rctx, w.name)
		cancel()
		if ctx.Err() != nil {
			return
		}
		place := ""
		if err == nil {
			place = placeOf(st, label)
		}
		switch now := time.Now(); {
		case last.IsZero() && place == "" && now.Sub(start) < firstLine:
			// Not in the queue yet, or being granted.
			t.Reset(firstLook)
			continue
		case last.IsZero(), place != lastPlace:
		case now.Sub(last) >= every:
			every = min(2*every, progressMax)
		default:
			t.Reset(progressPoll)
			continue
		}
		what := "for"
		if w.elect {
			what = "to lead"
		}
		paren := ""
		if place != "" {
			paren = " (" + place + ")"
		}
		fmt.Fprintf(w.stderr, "fairlock: waiting %s %q%s, %s\n", what, w.name, paren, waited(time.Since(start)))
		last, lastPlace = time.Now(), place
		t.Reset(progressPoll)
	}
}

// placeOf is the place in st's queue of the waiter labelled label: "3rd in
// line"; "past 1000th in line" when the queue is longer than Status lists
// and it is not among those listed; "" when it is not queued.
func placeOf(st fairlock.Status, label string) string {
	for i, wt := range st.Waiters {
		if wt.Owner == label {
			return ordinal(i+1) + " in line"
		}
	}
	if st.Queued > int64(len(st.Waiters)) {
		return "past " + ordinal(len(st.Waiters)) + " in line"
	}
	return ""
}

// ordinal renders n as 1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st, ...
func ordinal(n int) string {
	suffix := "th"
	switch n % 10 {
	case 1:
		suffix = "st"
	case 2:
		suffix = "nd"
	case 3:
		suffix = "rd"
	}
	if n%100 >= 11 && n%100 <= 13 {
		suffix = "th"
	}
	return fmt.Sprintf("%d%s", n, suffix)
}

// waited renders how long a wait has lasted: 4.0s under a minute, else
// to the second (2m5s).
func waited(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}
