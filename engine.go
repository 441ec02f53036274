package fairlock

import (
	"context"
	"errors"
	"time"

	"github.com/fairlock/fairlock/internal/engine"
)

// The engine's face for the packages built on it (semaphore, election,
// the command line): internal/engine's functions, set here, so that they
// need no exported hook of the engine's and run no script of their own.
func init() {
	engine.Validate = func(c any, req any) error { return c.(*Client).validate(req.(Request)) }
	engine.Subscribe = func(ctx context.Context, c any, channel string) (any, error) {
		s, err := c.(*Client).subscribe(ctx, channel)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	engine.CanSubscribe = func(c any) bool { return c.(*Client).canSubscribe() }
	engine.CondWait = func(ctx context.Context, lease any, cond string) (any, error) {
		l, err := lease.(*Lease).condWait(ctx, cond)
		if l == nil {
			return nil, err // a nil *Lease in an interface is not nil
		}
		return l, err
	}
	engine.Signal = func(ctx context.Context, c any, name, cond string, all bool) (int, error) {
		return c.(*Client).signal(ctx, name, cond, all)
	}
	engine.ValidateCondName = validateCondName
	engine.Deadlock = func(err error) (engine.Held, bool) {
		var d *deadlockError
		if !errors.As(err, &d) {
			return engine.Held{}, false
		}
		return engine.Held{Name: d.name, Held: d.held, Asked: d.asked, Tokens: d.tokens}, true
	}
	engine.Transient = transient
	engine.LeaderSet = func(ctx context.Context, c any, name string, term int64, value string, ttl time.Duration) (bool, error) {
		return c.(*Client).leaderSet(ctx, name, term, value, ttl)
	}
	engine.LeaderClear = func(ctx context.Context, c any, name string, term int64) error {
		return c.(*Client).leaderClear(ctx, name, term)
	}
	engine.LeaderGet = func(ctx context.Context, c any, name string) (engine.Leader, error) {
		return c.(*Client).leaderGet(ctx, name)
	}
	engine.AtCloseRelease = func(lease any, f func(ctx context.Context)) {
		l := lease.(*Lease)
		l.mu.Lock()
		l.atClose = f
		l.mu.Unlock()
	}
	engine.ReportWait = func(c any, name string) (func(), func(error)) { return c.(*Client).reportWait(name) }
	engine.LeaderChannel = func(c any, name string) (string, error) {
		k, err := c.(*Client).keys(name)
		return leaderChannel(k), err
	}
}
