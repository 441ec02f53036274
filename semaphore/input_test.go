package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

// Semantics 10: bad arguments get clear errors before anything reaches
// Redis.
func TestBadArguments(t *testing.T) {
	b := redistest.Mini(t)
	e := fltest.New(t, b)
	c := e.Client()
	var nilClient *redis.Client
	for _, tc := range []struct {
		what string
		err  error
		want error
	}{
		{"New(nil)", second(fairlock.New(nil)), fairlock.ErrInvalidArgument},
		{"New(nil *redis.Client)", second(fairlock.New(nilClient)), fairlock.ErrInvalidArgument},
		{"WithLeaseTTL(0)", second(fairlock.New(e.RDB, fairlock.WithLeaseTTL(0))), fairlock.ErrInvalidArgument},
		{"WithLeaseTTL(-1s)", second(fairlock.New(e.RDB, fairlock.WithLeaseTTL(-time.Second))), fairlock.ErrInvalidArgument},
		{"WithWaiterTTL(0)", second(fairlock.New(e.RDB, fairlock.WithWaiterTTL(0))), fairlock.ErrInvalidArgument},
		{"WithPrefix with a brace", second(fairlock.New(e.RDB, fairlock.WithPrefix("a{b"))), fairlock.ErrInvalidArgument},
		{"semaphore.New(nil client)", second(semaphore.New(nil, "x", 1)), fairlock.ErrInvalidArgument},
		{"empty name", second(semaphore.New(c, "", 1)), fairlock.ErrInvalidName},
		{"oversize name", second(semaphore.New(c, strings.Repeat("x", fairlock.MaxNameLen+1), 1)), fairlock.ErrInvalidName},
		{"name with newline", second(semaphore.New(c, "a\nb", 1)), fairlock.ErrInvalidName},
		{"name not UTF-8", second(semaphore.New(c, "a\xffb", 1)), fairlock.ErrInvalidName},
		{"name that is only a tag", second(semaphore.New(c, "{x}", 1)), fairlock.ErrInvalidName},
		{"untagged name with a closing brace", second(semaphore.New(c, "a}b", 1)), fairlock.ErrInvalidName},
		{"capacity 0", second(semaphore.New(c, "x", 0)), fairlock.ErrInvalidArgument},
		{"capacity -1", second(semaphore.New(c, "x", -1)), fairlock.ErrInvalidArgument},
		{"capacity too large", second(semaphore.New(c, "x", fairlock.MaxCapacity+1)), fairlock.ErrInvalidArgument},
		{"NewMutex with empty name", second(semaphore.NewMutex(c, "")), fairlock.ErrInvalidName},
		{"NewRWMutex with empty name", second(semaphore.NewRWMutex(c, "")), fairlock.ErrInvalidName},
	} {
		fltest.IsErr(t, tc.what, tc.err, tc.want)
	}
	// Names that are odd but valid work.
	for _, name := range []string{"ünïcode ✓", "with space", "{tag}:x", "{a}b}", "x{", strings.Repeat("n", fairlock.MaxNameLen)} {
		l, err := newSem(t, c, name, 1).Acquire(context.Background(), 1)
		if err != nil {
			t.Fatalf("Acquire on %q: %v", name, err)
		}
		e.Release(l)
	}
	for _, k := range e.Keys() {
		if !strings.HasSuffix(k, ":s") && !strings.HasSuffix(k, ":t") {
			t.Fatalf("left key %s", k)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// A constructor's error names the call and the semaphore, and fairlock
// once.
func TestConstructorErrorsNameTheCall(t *testing.T) {
	b := redistest.Mini(t)
	c, err := fairlock.New(b.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, semErr := semaphore.New(c, "jobs", 0)
	_, mutexErr := semaphore.NewMutex(c, "")
	_, rwErr := semaphore.NewRWMutex(nil, "rw")
	for _, tc := range []struct {
		err  error
		is   error
		text string
	}{
		{semErr, fairlock.ErrInvalidArgument, `fairlock: new semaphore "jobs": invalid argument: capacity 0 `},
		{mutexErr, fairlock.ErrInvalidName, `fairlock: new mutex "": invalid name: empty`},
		{rwErr, fairlock.ErrInvalidArgument, `fairlock: new rw mutex "rw": invalid argument: nil client`},
	} {
		if !errors.Is(tc.err, tc.is) || !strings.HasPrefix(fmt.Sprint(tc.err), tc.text) || strings.Count(fmt.Sprint(tc.err), "fairlock:") != 1 {
			t.Errorf("error %q, want one matching %v that starts %q and names fairlock once", tc.err, tc.is, tc.text)
		}
	}
}
