package callpath

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/script"
)

// Caller is a client's script call path, the one way its ops reach
// Redis: run sends an op's script through the Backend (and waits for
// replicas under WithReplicaAck), call bounds a call by its context and
// hands what comes after it to clean-up. Everything above it speaks in
// ops (opCall) and outcomes; nothing else of the client sends a script.
type Caller struct {
	B           backend.Backend
	Info        backend.Info // b's
	Scripts     *script.Set
	AckReplicas int // WithReplicaAck's; 0 for none
	AckTimeout  time.Duration
	// Spawn runs a function on a goroutine the client's Close waits for
	// (the root package's Client.spawn): a call's own, and its clean-up.
	Spawn func(func())
	// Batch sends concurrent calls together (WithBatching); nil for none.
	Batch *Batcher
}

// Run is the one way the client runs a script: oc's op, on its keys,
// through the script that serves it, on the client's Backend. With
// WithReplicaAck, for the ops whose writes must reach replicas (op.ack),
// it also waits, on the same connection, until the configured number of
// replicas has the script's writes; the second result reports when they
// did not (the script's own reply and error are in the result either
// way).
func (c *Caller) Run(ctx context.Context, oc script.Call) (script.Result, error) {
	s, keys, args := c.Scripts.ForOp(oc.Op), oc.Keys, oc.Args
	if c.AckReplicas == 0 || !oc.Op.Ack {
		if c.Batch.batches(ctx, oc) {
			return c.Batch.do(ctx, oc), nil
		}
		return c.Alone(ctx, s, keys, args, oc.Argv), nil
	}
	var acked int64
	var waitErr error
	res := s.Run(ctx, c.B, c.Info.Functions, func(sc backend.Script) script.Result {
		sc.Boxed = boxedArgs(oc.Argv, sc.Args)
		var r script.Result
		r.Val, acked, r.Err, waitErr = c.B.ScriptWait(ctx, sc, c.AckReplicas, c.AckTimeout)
		return r
	}, keys, args)
	switch {
	case res.Err != nil:
		return res, nil
	case waitErr != nil:
		return res, fmt.Errorf("%w: %w: WAIT: %w", fault.ErrRedis, fault.ErrNotReplicated, waitErr)
	case acked < int64(c.AckReplicas):
		return res, fmt.Errorf("%w: %w: %d of %d replicas acknowledged within %v", fault.ErrRedis, fault.ErrNotReplicated, acked, c.AckReplicas, c.AckTimeout)
	}
	return res, nil
}

// settle returns o, the outcome handed to call's caller, and true; or,
// when o's error is ctx's own (ctx's error, or a socket's deadline set
// from ctx's, once that has passed: see deadlineLike), an outcome holding
// ctx's error and false, as when ctx ended before the outcome came, with o
// handed to late. A caller given false reports the outcome's error, which
// ctx.Err() may not yet be. A client that honours deadlines itself
// (rueidis, valkey-go) stops waiting for the answer when ctx ends: the
// script may have run all the same.
func (c *Caller) settle(ctx context.Context, o Outcome, late func(Outcome)) (Outcome, bool) {
	if o.Res.Err == nil || !DeadlineLike(o.Res.Err) && !errors.Is(o.Res.Err, context.Canceled) {
		return o, true
	}
	err := ctx.Err()
	if err == nil && PastDeadline(ctx) {
		// The client saw the deadline pass before ctx's own timer ended
		// ctx (a moment from now; for a context whose Done does not
		// close at its deadline, never): the deadline stands.
		err = context.DeadlineExceeded
	}
	if err == nil || !errors.Is(o.Res.Err, err) && !(errors.Is(err, context.DeadlineExceeded) && DeadlineLike(o.Res.Err)) {
		return o, true
	}
	if late != nil {
		c.Spawn(func() { late(o) })
	}
	return Outcome{Res: script.Result{Err: err}}, false
}

// DeadlineLike reports whether err is a deadline's: a context's, or a
// socket's (os.ErrDeadlineExceeded, "i/o timeout"), which a client that
// sets its connection's deadlines from ctx's (rueidis, valkey-go, go-redis
// with ContextTimeoutEnabled, a dial under ctx) reports when ctx's
// deadline passes before ctx's own timer has ended it.
func DeadlineLike(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)
}

// PastDeadline reports whether ctx has a deadline and it has passed, which
// can be a while (under load, hundreds of milliseconds) before ctx.Err()
// says so: ctx's timer fires on a goroutine of its own.
func PastDeadline(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// Outcome is what Run returned.
type Outcome struct {
	Res    script.Result
	AckErr error
}

// Op runs oc through Call: bounded by ctx, late given what came after
// it (see call).
func (c *Caller) Op(ctx context.Context, oc script.Call, late func(Outcome)) (Outcome, bool) {
	if c.OnCaller(ctx) {
		res, ackErr := c.Run(ctx, oc)
		return c.returned(ctx, Outcome{res, ackErr}, late)
	}
	t := newCallTask(c, ctx, late)
	t.oc = oc
	return c.hop(t)
}

// Grace is how long a call whose context ended still waits for an answer
// already on its way, so that with a healthy Redis a cancelled Acquire has
// left its queue when it returns. A call waits at most two graces (its
// script's, then its clean-up's) past its context's end.
const Grace = 30 * time.Millisecond

// Call runs do(ctx) and returns its outcome, but returns no later than
// ctx's end (plus grace), even when go-redis would not notice it: unless the go-redis
// client sets Options.ContextTimeoutEnabled, a command sent to a Redis
// that does not answer waits for go-redis's ReadTimeout (5 s by default),
// and go-redis retries a connection it cannot open for over a second.
//
// When ctx can end and the Backend does not itself return by its end
// (backend.Info.Deadlines), do runs on a goroutine of the client's (see
// spawn); otherwise on the caller's.
// If ctx ends first, Call returns ok false and an outcome holding ctx's
// error; the goroutine then hands do's outcome, when it arrives, to late
// (if not nil), which cleans up after it: withdraws a ticket the script
// queued or granted, or sends again a release that failed. late is given
// the caller's context, ended; it must bound what it does itself.
// If do ends because a dial it waited for failed (Redis refused the
// connection or its name did not resolve; see run), Call returns ok true
// and that outcome, whose error matches ErrRedis (isDialError), and hands
// it to late as well, in the background: an earlier attempt may have sent
// the script.
func (c *Caller) Call(ctx context.Context, do func(context.Context) Outcome, late func(Outcome)) (o Outcome, ok bool) {
	if c.OnCaller(ctx) {
		return c.returned(ctx, do(ctx), late)
	}
	t := newCallTask(c, ctx, late)
	t.do = do
	return c.hop(t)
}

// hop runs t on a goroutine of the client's (see Call) and waits for its
// outcome until t's context ends, and a grace after.
func (c *Caller) hop(t *callTask) (Outcome, bool) {
	ctx, late := t.ctx, t.late
	c.Spawn(t.runFn)
	select {
	case o := <-t.ch:
		t.recycle()
		return c.settle(ctx, o, late)
	case <-ctx.Done():
	}
	// A Redis that answers does so within the grace; the caller then
	// acts on the outcome itself, as if ctx had ended a moment later.
	timer := time.NewTimer(Grace)
	defer timer.Stop()
	select {
	case o := <-t.ch:
		t.recycle()
		return c.settle(ctx, o, late)
	case <-timer.C:
		if !t.state.CompareAndSwap(0, 2) {
			o := <-t.ch // the outcome came as the grace ended: use it
			t.recycle()
			return c.settle(ctx, o, late)
		}
		return Outcome{Res: script.Result{Err: ctx.Err()}}, false
	}
}

// callTask is a call that runs on a goroutine of the client's (see Call):
// what it runs (do, or else the op oc), where its outcome goes, and
// whether its caller still waits for it. A task whose outcome its caller
// received goes back to callTasks for the next call; one its caller
// abandoned is left to the garbage collector, as its goroutine may still
// read it.
type callTask struct {
	state atomic.Int32 // 0 running, 1 handed to the caller, 2 abandoned by it
	ch    chan Outcome
	c     *Caller
	ctx   context.Context
	late  func(Outcome)
	do    func(context.Context) Outcome
	oc    script.Call
	runFn func() // t.run, made once per pooled task
}

// callTasks keeps the tasks of calls that ended, with their channels.
var callTasks = sync.Pool{New: func() any {
	t := &callTask{ch: make(chan Outcome, 1)}
	t.runFn = t.run
	return t
}}

// newCallTask returns a task of c's for a call under ctx whose outcome,
// if its caller no longer waits for it, goes to late.
func newCallTask(c *Caller, ctx context.Context, late func(Outcome)) *callTask {
	t := callTasks.Get().(*callTask)
	t.c, t.ctx, t.late = c, ctx, late
	return t
}

// run runs t's call and hands its outcome to the caller, or, when the
// caller no longer waits for it, to late. Once the outcome is sent, run
// no longer touches t: its caller may have recycled it.
func (t *callTask) run() {
	c, ctx, late := t.c, t.ctx, t.late
	var o Outcome
	if t.do != nil {
		o = t.do(ctx)
	} else {
		res, ackErr := c.Run(ctx, t.oc)
		o = Outcome{res, ackErr}
	}
	if t.state.CompareAndSwap(0, 1) {
		t.ch <- o
		if late != nil && fault.IsDialError(o.Res.Err) {
			late(o)
		}
	} else if late != nil {
		late(o)
	}
}

// recycle puts t, whose outcome its caller has received, back for the
// next call.
func (t *callTask) recycle() {
	*t = callTask{ch: t.ch, runFn: t.runFn}
	callTasks.Put(t)
}

// OnCaller reports whether a call under ctx runs on its caller's
// goroutine: when ctx cannot end, or when the Backend returns by its
// context's end (backend.Info.Deadlines).
func (c *Caller) OnCaller(ctx context.Context) bool {
	return ctx.Done() == nil || c.Info.Deadlines
}

// returned is call's end for an outcome o that do returned on the
// caller's goroutine (see onCaller).
func (c *Caller) returned(ctx context.Context, o Outcome, late func(Outcome)) (Outcome, bool) {
	if late != nil && fault.IsDialError(o.Res.Err) {
		c.Spawn(func() { late(o) })
	}
	if ctx.Done() == nil {
		return o, true
	}
	// The Backend returned by ctx's end: an outcome that is ctx's error
	// goes to late, as from a goroutine of the client's.
	return c.settle(ctx, o, late)
}

// RunRaw runs the script that serves the op named op with keys and args as
// they are, through the Backend alone: no WAIT, no resend (tests only;
// see internal/testhook).
func (c *Caller) RunRaw(ctx context.Context, op string, keys, args []string) (any, error) {
	o := script.OpNamed(op)
	if o == nil {
		return nil, fmt.Errorf("fairlock: no script serves op %q", op)
	}
	r := c.Alone(ctx, c.Scripts.ForOp(o), keys, args, nil)
	return r.Val, r.Err
}

// Alone runs s with keys and args (argv: args boxed, or nil) through the
// Backend, each script command sent by itself (no WAIT after it).
func (c *Caller) Alone(ctx context.Context, s *script.Script, keys, args []string, argv []any) script.Result {
	return s.Run(ctx, c.B, c.Info.Functions, func(sc backend.Script) script.Result {
		sc.Boxed = boxedArgs(argv, sc.Args)
		v, err := c.B.Script(ctx, sc)
		return script.Result{Val: v, Err: err}
	}, keys, args)
}

// boxedArgs returns argv as a Script's Boxed for args: argv when it holds
// every argument (an opCall's argv is args boxed, or shorter when args
// were appended to without it; see opCall.argv), else nil.
func boxedArgs(argv []any, args []string) []any {
	if len(argv) != len(args) {
		return nil
	}
	return argv
}
