package redistest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/redis/go-redis/v9"
)

// Faults is a go-redis hook that cuts a client off from Redis, as if its
// process had died or been partitioned (Down), holds its BLPOPs back, as
// if the process had stalled before reading its wake-ups (Deafen), or holds
// back the replies of commands Redis has run, as if the process had
// stalled after sending them (Stall).
type Faults struct {
	Down    atomic.Bool
	mu      sync.Mutex
	deaf    chan struct{}           // while non-nil, BLPOPs wait for it to close
	stall   chan struct{}           // set by Stall: held replies wait for it to close
	match   func(reply string) bool // the reply that starts the stall
	stalled bool                    // a reply matched: hold every reply
	held    []string                // the replies Stall held back, as cmd.String()
}

// ErrCutOff is the error every command of a client whose Faults is Down
// returns.
var ErrCutOff = errors.New("test: cut off from redis")

func (f *Faults) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *Faults) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f *Faults) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "blpop" || cmd.Name() == "blmpop" {
			f.mu.Lock()
			deaf := f.deaf
			f.mu.Unlock()
			if deaf != nil {
				<-deaf
			}
		}
		if f.Down.Load() {
			cmd.SetErr(ErrCutOff)
			return ErrCutOff
		}
		err := next(ctx, cmd)
		f.mu.Lock()
		stall := f.stall
		if stall != nil && !f.stalled && (f.match == nil || f.match(replyOf(cmd))) {
			f.stalled = true
		}
		if !f.stalled {
			stall = nil
		}
		if stall != nil {
			f.held = append(f.held, cmd.String())
		}
		f.mu.Unlock()
		if stall != nil {
			<-stall
		}
		return err
	}
}

// replyOf renders the reply of a script or a blocking read (BLPOP,
// BLMPOP: the commands fairlock sends), or "" for other commands.
func replyOf(cmd redis.Cmder) string {
	switch c := cmd.(type) {
	case *redis.Cmd:
		return fmt.Sprint(c.Val())
	case *redis.StringSliceCmd:
		return fmt.Sprint(c.Val())
	case *redis.KeyValuesCmd: // BLMPOP
		k, v := c.Val()
		return fmt.Sprint(k, v)
	}
	return ""
}

// Stall makes the client stall, as a paused process would, at the first
// reply from now on for which match returns true (any reply when match is
// nil; a script's or a BLPOP's reply is passed as fmt.Sprint renders its
// value): that reply and every one after it are held back until the
// returned function is called (also called when the test ends). Redis has
// run those commands; the client learns their replies only then. Contexts
// do not end the stall.
func (f *Faults) Stall(t testing.TB, match func(reply string) bool) (resume func()) {
	ch := make(chan struct{})
	f.mu.Lock()
	f.stall, f.match, f.stalled = ch, match, false
	f.mu.Unlock()
	var once sync.Once
	resume = func() {
		once.Do(func() {
			f.mu.Lock()
			f.stall, f.match, f.stalled = nil, nil, false
			f.mu.Unlock()
			close(ch)
		})
	}
	t.Cleanup(resume)
	return resume
}

// Held returns the replies Stall has held back so far, each as its
// command's String (the command and its reply).
func (f *Faults) Held() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.held...)
}

// Deafen holds BLPOPs back until the returned function is called (also
// called when the test ends).
func (f *Faults) Deafen(t testing.TB) func() {
	ch := make(chan struct{})
	f.mu.Lock()
	f.deaf = ch
	f.mu.Unlock()
	var once sync.Once
	undo := func() {
		once.Do(func() {
			f.mu.Lock()
			f.deaf = nil
			f.mu.Unlock()
			close(ch)
		})
	}
	t.Cleanup(undo)
	return undo
}

// Hear lets held BLPOPs go, if Deafen holds them.
func (f *Faults) Hear() {
	f.mu.Lock()
	ch := f.deaf
	f.deaf = nil
	f.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
}

// AddHook adds h to rdb and returns the fairlock.Option (O) that adds h
// to the blocking client a fairlock client built on rdb makes (see
// internal/testhook): pass it to fairlock.New, so that faults and
// counters also reach that client's BLPOPs.
func AddHook[O any](rdb interface{ AddHook(redis.Hook) }, h redis.Hook) O {
	rdb.AddHook(h)
	return testhook.BlockingHooks[O](h)
}
