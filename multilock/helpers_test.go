package multilock_test

import (
	"context"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// env is one test's view of a backend (see fltest.Env).
type env struct {
	*fltest.Env
	t *testing.T
}

func newEnv(t *testing.T, b *redistest.Backend) *env { return &env{Env: fltest.New(t, b), t: t} }

func (e *env) status(name string) fairlock.Status {
	e.t.Helper()
	st, err := e.Client().Status(context.Background(), name)
	if err != nil {
		e.t.Fatalf("Status(%q): %v", name, err)
	}
	return st
}

// hold acquires req with c, failing the test on an error.
func (e *env) hold(c *fairlock.Client, req fairlock.Request) *fairlock.Lease {
	e.t.Helper()
	l, err := c.Acquire(context.Background(), req)
	if err != nil {
		e.t.Fatalf("Acquire(%+v): %v", req, err)
	}
	return l
}

// waitQueued waits until n requests wait for name.
func (e *env) waitQueued(name string, n int) {
	e.t.Helper()
	fltest.WaitWaiters(e.t, e.Client(), name, n)
}

func one(name string) fairlock.Request { return fairlock.Request{Name: name, Capacity: 1, Permits: 1} }
