package fairlock_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A call whose command Redis does not answer within go-redis's read
// timeout fails with an error matching ErrRedis (and the net.Error
// timeout) that says Redis did not answer and names the server: one that
// accepts connections and never answers, and a redis-server that answered
// and then stopped (SIGSTOP).
func TestNoAnswerNamesTheServer(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn // read nothing, answer nothing
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	srv, err := redisserver.Start()
	if err != nil {
		t.Skipf("no redis-server: %v", err)
	}
	defer srv.Stop()

	for _, tc := range []struct {
		name  string
		addr  string
		stall func(t *testing.T, rdb *redis.Client) (resume func())
	}{
		{"never answers", ln.Addr().String(), func(*testing.T, *redis.Client) func() { return func() {} }},
		{"stopped after answering", srv.Addr, func(t *testing.T, rdb *redis.Client) func() {
			if err := rdb.Ping(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			if err := srv.Pause(); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := srv.Resume(); err != nil {
					t.Fatal(err)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: tc.addr, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
			defer rdb.Close()
			c, err := fairlock.New(rdb)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Abandon()
			defer tc.stall(t, rdb)()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = c.TryAcquire(ctx, fairlock.Request{Name: "x", Capacity: 1, Permits: 1})
			var ne net.Error
			switch {
			case !errors.Is(err, fairlock.ErrRedis) || !errors.As(err, &ne) || !ne.Timeout():
				t.Fatalf("TryAcquire = %v, want an error matching ErrRedis and a net.Error timeout", err)
			case !strings.Contains(err.Error(), "Redis at "+tc.addr+" did not answer in time"):
				t.Fatalf("TryAcquire = %q, want it to say that Redis at %s did not answer in time", err, tc.addr)
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
}
