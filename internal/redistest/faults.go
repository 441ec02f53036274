package redistest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fairlock/fairlock/internal/listenhook"
	"github.com/redis/go-redis/v9"
)

// Faults is a go-redis hook that cuts a client off from Redis, as if its
// process had died or been partitioned (Down), or holds its BLPOPs back, as
// if the process had stalled before reading its wake-ups (Deafen).
type Faults struct {
	Down atomic.Bool
	mu   sync.Mutex
	deaf chan struct{} // while non-nil, BLPOPs wait for it to close
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
		if cmd.Name() == "blpop" {
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
		return next(ctx, cmd)
	}
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

// AddHook adds h to rdb and to the blocking clients fairlock builds for rdb
// (see internal/listenhook), for the rest of the test. Tests use it instead
// of rdb.AddHook so that faults and counters also reach fairlock's BLPOPs.
func AddHook(t testing.TB, rdb interface{ AddHook(redis.Hook) }, h redis.Hook) {
	rdb.AddHook(h)
	t.Cleanup(listenhook.Add(rdb, h))
}
