package fairlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// Every call's error is one *Error: it names the operation and the
// semaphores, names fairlock once, and still matches the sentinels (and,
// for Redis's refusals, Redis's own error) with errors.Is and errors.As.
func TestErrorsNameFairlockOnce(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		c := e.Client()
		req := fairlock.Request{Name: "e", Capacity: 1, Permits: 1}
		l, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		// A key of another type where fairlock keeps a semaphore's state.
		if err := e.RDB.Set(ctx, e.Key("w", "s"), "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		_, notAcquired := c.TryAcquire(ctx, req)
		_, wrongType := c.Acquire(ctx, fairlock.Request{Name: "w", Capacity: 1, Permits: 1})
		_, badName := c.Acquire(ctx, fairlock.Request{Name: "", Capacity: 1, Permits: 1})
		e.Release(l)
		notHeld := l.Release(ctx)
		_, badNew := fairlock.New(nil)

		for _, tc := range []struct {
			err   error
			op    string
			names []string
			is    error
			text  string
		}{
			{notAcquired, "try acquire", []string{"e"}, fairlock.ErrNotAcquired, `fairlock: try acquire "e": not acquired`},
			{wrongType, "acquire", []string{"w"}, fairlock.ErrForeignKey, `fairlock: acquire "w": key written by another program: "`},
			{badName, "acquire", []string{""}, fairlock.ErrInvalidName, `fairlock: acquire "": invalid name: empty`},
			{notHeld, "release", []string{"e"}, fairlock.ErrNotHeld, `fairlock: release "e": lease not held`},
			{badNew, "new", nil, fairlock.ErrInvalidArgument, `fairlock: new: invalid argument: nil redis client`},
		} {
			var fe *fairlock.Error
			switch {
			case !errors.As(tc.err, &fe):
				t.Fatalf("%v is a %T, not a *fairlock.Error", tc.err, tc.err)
			case fe.Op != tc.op || strings.Join(fe.Names, ",") != strings.Join(tc.names, ","):
				t.Fatalf("%v: op %q on %q, want %q on %q", tc.err, fe.Op, fe.Names, tc.op, tc.names)
			case !errors.Is(tc.err, tc.is):
				t.Fatalf("%v does not match %v", tc.err, tc.is)
			case !strings.HasPrefix(tc.err.Error(), tc.text) || strings.Count(tc.err.Error(), "fairlock:") != 1:
				t.Fatalf("message %q, want it to start with %q and name fairlock once", tc.err, tc.text)
			}
		}
		if !errors.Is(wrongType, fairlock.ErrRedis) || !strings.Contains(wrongType.Error(), `{w}:s" holds a string where fairlock keeps a hash`) {
			t.Fatalf("%q does not match ErrRedis, or does not name the key and its type", wrongType)
		}
	})
}
