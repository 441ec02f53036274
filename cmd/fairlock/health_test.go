package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// A wait that runs out (-w) exits 75 only when NAME was busy and Redis
// answered; when Redis did not answer (stopped: SIGSTOP; or nothing
// listening) it exits 70 and says so, naming Redis's address and what
// happened, so that "fairlock run -w ... || echo busy" does not report a
// dead Redis as a busy lock.
func TestRunTellsRedisTroubleFromABusyLock(t *testing.T) {
	srv, err := redisserver.Start()
	if err != nil {
		t.Skipf("no redis-server: %v", err)
	}
	defer srv.Stop()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there now

	c := newCLIOn(t, srv.Addr)
	held, err := c.lib.Acquire(context.Background(), fairlock.Request{Name: "busy", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		addr   string
		before func() // makes Redis so; after undoes it
		after  func()
		want   int
		says   []string
	}{
		{name: "busy", addr: srv.Addr, want: exitNotGot, says: []string{`waited 1s for "busy" (held by lib); giving up (-w)`}},
		{name: "stalled", addr: srv.Addr, want: exitError,
			before: func() {
				if err := srv.Pause(); err != nil {
					t.Fatal(err)
				}
			},
			after: func() {
				if err := srv.Resume(); err != nil {
					t.Fatal(err)
				}
			},
			says: []string{`waited 1s for "busy", but Redis did not answer (Redis at ` + srv.Addr + `: timed out); not a busy lock`}},
		{name: "refused", addr: closed, want: exitError, says: []string{closed, "connection refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before != nil {
				tc.before()
				defer tc.after()
			}
			var stderr bytes.Buffer
			cmd := exec.Command(bin, "run", "-redis", "redis://"+tc.addr, "-prefix", c.prefix, "-w", "1s", "busy", "--", "true")
			cmd.Stderr = &stderr
			got := exit(t, cmd)
			out := strings.TrimSpace(stderr.String())
			if got != tc.want {
				t.Fatalf("exit %d, want %d; stderr: %s", got, tc.want, out)
			}
			for _, s := range tc.says {
				if !strings.Contains(out, s) {
					t.Errorf("stderr %q does not say %q", out, s)
				}
			}
			if strings.Count(out, "\n") != 0 {
				t.Errorf("stderr has more than one line: %q", out)
			}
		})
	}
	if err := held.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// What a wait's end concludes from the commands Redis answered or not
// while it waited, and from a PING at its end.
func TestRedisHealthJudgesTheWait(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	live, cut := context.Background(), func() context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}()
	ok := func(context.Context) error { return nil }
	for _, tc := range []struct {
		name    string
		before  []error           // outcomes noted before the wait began
		ctxs    []context.Context // the context of each outcome noted during it
		during  []error
		ping    func(context.Context) error
		trouble string // "" for none
	}{
		{"answered", nil, []context.Context{live}, []error{nil}, ok, ""},
		{"an error reply is an answer", nil, []context.Context{live}, []error{redis.Nil}, ok, ""},
		{"answered only before the wait", []error{nil}, nil, nil, ok, "timed out"},
		{"refused after answering", nil, []context.Context{live, live}, []error{nil, refused}, ok, "connection refused"},
		{"answered again after a refusal", nil, []context.Context{live, live}, []error{refused, nil}, ok, ""},
		{"a command cut short by its caller says nothing", nil, []context.Context{live, cut}, []error{nil, context.DeadlineExceeded}, ok, ""},
		{"no answer to the PING", nil, []context.Context{live}, []error{nil}, func(context.Context) error { return context.DeadlineExceeded }, "timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newRedisHealth("Redis at 10.0.0.1:6379")
			for _, err := range tc.before {
				h.note(live, err)
			}
			start := time.Now()
			for !time.Now().After(start) { // (a coarse clock)
			}
			for i, err := range tc.during {
				h.note(tc.ctxs[i], err)
			}
			err := h.troubleSince(start, tc.ping)
			switch {
			case tc.trouble == "" && err != nil:
				t.Fatalf("troubleSince = %v, want nil", err)
			case tc.trouble != "" && (!errors.Is(err, errNoAnswer) || !strings.Contains(err.Error(), "Redis at 10.0.0.1:6379: "+tc.trouble)):
				t.Fatalf("troubleSince = %v, want an error matching errNoAnswer saying %q with the address", err, tc.trouble)
			}
		})
	}
}
