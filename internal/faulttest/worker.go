package faulttest

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/clients"
	"github.com/fairlock/fairlock/internal/fltest"
)

// stallMin is the shortest stall of a worker that its log records.
const stallMin = 100 * time.Millisecond

// envWorker tells a test binary to run a worker (its mode) in place of the
// tests.
const envWorker = "FAIRLOCK_WORKER"

// IsWorker reports whether this process was started as a worker of a
// fault test: its TestMain then runs [WorkerMain] in place of the tests.
func IsWorker() bool { return os.Getenv(envWorker) != "" }

// spec is what a worker process is told, through its environment.
type spec struct {
	addr, prefix, name string
	capacity, permits  int64
	lease, waiter      time.Duration
	hold               time.Duration // loop: time in the critical section
	log                string        // loop: the occupancy log
}

func (s spec) env(mode string) []string {
	return append(os.Environ(),
		// Under -race, a process sleeps a second before it exits unless
		// told not to.
		"GORACE=atexit_sleep_ms=0",
		envWorker+"="+mode,
		"FL_ADDR="+s.addr, "FL_PREFIX="+s.prefix, "FL_NAME="+s.name,
		"FL_CAP="+strconv.FormatInt(s.capacity, 10), "FL_PERMITS="+strconv.FormatInt(s.permits, 10),
		"FL_LEASE="+s.lease.String(), "FL_WAITER="+s.waiter.String(),
		"FL_HOLD="+s.hold.String(), "FL_LOG="+s.log)
}

func specFromEnv() spec {
	d := func(k string) time.Duration { v, _ := time.ParseDuration(os.Getenv(k)); return v }
	n := func(k string) int64 { v, _ := strconv.ParseInt(os.Getenv(k), 10, 64); return v }
	return spec{addr: os.Getenv("FL_ADDR"), prefix: os.Getenv("FL_PREFIX"), name: os.Getenv("FL_NAME"),
		capacity: n("FL_CAP"), permits: n("FL_PERMITS"), lease: d("FL_LEASE"), waiter: d("FL_WAITER"),
		hold: d("FL_HOLD"), log: os.Getenv("FL_LOG")}
}

// WorkerMain runs a worker process (see IsWorker) through dial and returns
// its exit code. It prints "ready" once its client is made, then works by
// its mode, and stops when its stdin closes.
//
//	loop: acquire (all names at once, for a list), log "enter" for each,
//	      hold, log "exit" for each, release; on errors log "error" and
//	      try again; when stdin closes, Close, and log "closed <error>"
//	      if it failed
//	hold: acquire once, print "acquired <token>", and hold until stdin
//	      closes; if the lease ends first, print "done <cause>" and
//	      "release <error>"
//	close, shutdown, abandon: acquire once, print "acquired <token>",
//	      and when stdin closes end the client holding the lease, by
//	      Close, Shutdown (10 s, while the work releases its lease) or
//	      Abandon, print "closed <error>" and "lease <cause>", and exit
func WorkerMain(dial clients.Dial) int {
	mode := os.Getenv(envWorker)
	s := specFromEnv()
	c, closeRedis, err := dial(clients.Target{Addr: s.addr}, fairlock.WithPrefix(s.prefix), fairlock.WithLeaseTTL(s.lease),
		fairlock.WithWaiterTTL(s.waiter), fairlock.WithOwner(fmt.Sprintf("pid%d", os.Getpid())))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer closeRedis()
	defer c.Close()
	fmt.Println("ready")
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	// A name list "a,b" asks for all of them at once (a multi-lock).
	var reqs []fairlock.Request
	names := strings.Split(s.name, ",")
	for _, n := range names {
		reqs = append(reqs, fairlock.Request{Name: n, Capacity: s.capacity, Permits: s.permits})
	}
	switch mode {
	case "loop":
		f, err := os.OpenFile(s.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		defer f.Close()
		// One write per line, O_APPEND: lines of all workers land whole
		// and in the order their writes ran.
		logf := func(format string, args ...any) {
			_, _ = fmt.Fprintf(f, "%d %d "+format+"\n", append([]any{time.Now().UnixMicro(), os.Getpid()}, args...)...)
		}
		// The process's own stalls (spans the host did not run it), which
		// may outlast its leases' renewals: "stall <from> <till>" (µs).
		fltest.WatchStalls(ctx, stallMin, func(from, till time.Time) {
			logf("stall %d %d", from.UnixMicro(), till.UnixMicro())
		})
		for ctx.Err() == nil {
			actx, acancel := context.WithTimeout(ctx, 5*time.Second)
			l, err := c.AcquireAll(actx, reqs...)
			acancel()
			if err != nil {
				if ctx.Err() == nil {
					logf("error %q", err.Error())
					time.Sleep(20 * time.Millisecond)
				}
				continue
			}
			for _, p := range l.Parts() {
				logf("enter %d %d %s", p.Token, p.Permits, p.Name)
			}
			time.Sleep(s.hold)
			for _, p := range l.Parts() {
				logf("exit %d %d %s", p.Token, p.Permits, p.Name)
			}
			if err := l.Release(context.Background()); err != nil {
				logf("release %q", err.Error())
			}
		}
		// Close's error says what of the client's clean-up did not land.
		if err := c.Close(); err != nil {
			logf("closed %q", err.Error())
		}
		return 0
	case "hold":
		l, err := c.AcquireAll(ctx, reqs...)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("acquired", l.Token())
		select {
		case <-ctx.Done():
			_ = l.Release(context.Background())
		case <-l.Done():
			fmt.Printf("done %v\n", l.Err())
			fmt.Printf("release %v\n", l.Release(context.Background()))
			<-ctx.Done()
		}
		return 0
	case "close", "shutdown", "abandon":
		l, err := c.AcquireAll(ctx, reqs...)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("acquired", l.Token())
		<-ctx.Done()
		switch mode {
		case "close":
			err = c.Close()
		case "shutdown":
			// Shutdown waits for the work under the lease, which ends as
			// the process is told to stop and releases its lease.
			sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
			shut := make(chan error, 1)
			go func() { shut <- c.Shutdown(sctx) }()
			if rerr := l.Release(context.Background()); rerr != nil {
				fmt.Println("error", rerr)
			}
			err = <-shut
			scancel()
		case "abandon":
			err = c.Abandon()
		}
		fmt.Printf("closed %v\n", err)
		fmt.Printf("lease %v\n", l.Err())
		return 0
	}
	fmt.Println("error: unknown mode", mode)
	return 1
}
