package fairlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// dialWatch learns, through a dial hook on the client given to New, when
// Redis refuses a connection or its name does not resolve, so that calls
// waiting on their context return an error matching ErrRedis then, rather
// than after go-redis's dial retries (about 1.7 s with its defaults).
type dialWatch struct {
	mu  sync.Mutex
	ch  chan struct{} // closed at the next failure
	err error         // the last failure
}

func newDialWatch(rdb RedisClient) *dialWatch {
	h, ok := rdb.(interface{ AddHook(redis.Hook) })
	if !ok {
		return nil
	}
	w := &dialWatch{ch: make(chan struct{})}
	h.AddHook(w)
	return w
}

// next returns a channel closed at the next dial failure (nil without a
// watch: never).
func (w *dialWatch) next() <-chan struct{} {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ch
}

// failure returns the last dial failure, as fairlock's error.
func (w *dialWatch) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return &dialError{err: w.err}
}

// unreachable reports whether a dial's error says Redis cannot be reached
// now: the connection was refused, or the name did not resolve. (A dial
// that times out may be a slow network; go-redis's own deadline covers it.)
func unreachable(err error) bool {
	var dns *net.DNSError
	return errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &dns) && !dns.IsTimeout)
}

func (w *dialWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil && unreachable(err) {
			w.mu.Lock()
			w.err = err
			close(w.ch)
			w.ch = make(chan struct{})
			w.mu.Unlock()
		}
		return conn, err
	}
}

func (w *dialWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (w *dialWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// dialError is the error of a call that returned when a dial failed: it
// matches ErrRedis. Whether the call's script ran is not known (a call
// already connected may have), so its clean-up runs when the call ends,
// in the background.
type dialError struct{ err error }

func (e *dialError) Error() string   { return fmt.Sprintf("%v: cannot reach Redis: %v", ErrRedis, e.err) }
func (e *dialError) Unwrap() []error { return []error{ErrRedis, e.err} }

// isDialError reports whether err is a call's return at a dial failure.
func isDialError(err error) bool {
	var d *dialError
	return errors.As(err, &d)
}
