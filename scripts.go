package fairlock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed queue.lua
	queueLua string
	//go:embed acquire.lua
	acquireLua string
	//go:embed release.lua
	releaseLua string
)

// scripts are the engine's two scripts as one client runs them. Both start
// with queue.lua, the shared model and grant rule. They run through
// Script.Run: EVALSHA, falling back to EVAL after SCRIPT FLUSH or on a Redis
// that has not seen them yet.
type scripts struct {
	acquire, release *redis.Script
}

// newScripts builds the scripts, passing each source through transform
// when it is not nil (tests only; see internal/scripthook).
func newScripts(transform func(string) string) *scripts {
	build := func(src string) *redis.Script {
		if transform != nil {
			src = transform(src)
		}
		return redis.NewScript(src)
	}
	return &scripts{
		acquire: build(queueLua + "\n" + acquireLua),
		release: build(queueLua + "\n" + releaseLua),
	}
}

// defaultScripts serve every client made while no test hook is set.
var defaultScripts = newScripts(nil)

// nudgeScript pushes an empty wake-up onto a wake list, to end a blocked
// BLPOP at once when a client closes. It changes no semaphore state.
var nudgeScript = redis.NewScript(`redis.call('RPUSH', KEYS[1], '')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1`)

const capacityErrPrefix = "FAIRLOCK_CAPACITY "

// fail turns an error from Redis or the connection into fairlock's error
// for op on the semaphores names (in the order the script took them). It is
// the one place where Redis errors are mapped.
func fail(ctx context.Context, op string, names []string, err error) error {
	// Only the caller's context makes a context error the caller's; an
	// internal timeout means Redis did not answer in time.
	if ctxErr := ctx.Err(); ctxErr != nil {
		return opError(op, names, ctxErr)
	}
	if errors.Is(err, ErrRedis) {
		return opError(op, names, err)
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, capacityErrPrefix); ok {
		// "<stored> <index>": the capacity stored with the index-th
		// semaphore.
		stored, idx, _ := strings.Cut(rest, " ")
		i, _ := strconv.Atoi(idx)
		if len(names) > 1 && i >= 1 && i <= len(names) {
			return opError(op, names, fmt.Errorf("%w: stored capacity of %q is %s", ErrCapacityMismatch, names[i-1], stored))
		}
		return opError(op, names, fmt.Errorf("%w: stored capacity is %s", ErrCapacityMismatch, stored))
	}
	if strings.HasPrefix(msg, "CROSSSLOT") {
		return opError(op, names, fmt.Errorf("%w: %w", ErrCrossSlot, err))
	}
	return opError(op, names, fmt.Errorf("%w: %w", ErrRedis, err))
}

// labelOf names one semaphore ("a") or several (["a" "b"]) in messages.
func labelOf(names []string) string {
	if len(names) == 1 {
		return strconv.Quote(names[0])
	}
	return fmt.Sprintf("%q", names)
}

// reply reads a script's array reply as integers and strings.
type reply []any

func (r reply) int(i int) (int64, error) {
	if i >= len(r) {
		return 0, fmt.Errorf("short script reply %v", []any(r))
	}
	switch v := r[i].(type) {
	case int64:
		return v, nil
	case string:
		return strconv.ParseInt(v, 10, 64)
	}
	return 0, fmt.Errorf("unexpected script reply %v", []any(r))
}

// parseWake splits a wake-up "ticket expiryMs token..." pushed by
// queue.lua: the grant's expiry by Redis's clock, then one token per
// semaphore of the ticket's request.
func parseWake(s string) (ticket string, g grant, ok bool) {
	f := strings.Fields(s)
	if len(f) < 3 {
		return "", grant{}, false
	}
	g, err := parseGrant(f[1:])
	return f[0], g, err == nil
}

// grant is a grant as a script reports it: its expiry by Redis's clock and
// a token per semaphore.
type grant struct {
	expiry int64 // ms, Redis's clock
	tokens []int64
}

// parseGrant reads "expiryMs token..." fields.
func parseGrant(f []string) (grant, error) {
	if len(f) < 2 {
		return grant{}, fmt.Errorf("bad grant %q", f)
	}
	exp, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return grant{}, fmt.Errorf("bad grant expiry %q", f[0])
	}
	tokens, err := parseTokens(f[1:])
	return grant{expiry: exp, tokens: tokens}, err
}

// clockSample relates Redis's clock to the local one: a script that
// reported Redis's time redis was sent at local time sent, so Redis's
// moment redis came no earlier than sent.
type clockSample struct {
	sent  time.Time
	redis int64 // ms
}

// localDeadline returns a local time no later than the moment Redis's
// clock reaches at (ms), by s: so a lease counted to it ends, locally,
// before Redis can have expired it.
func (s clockSample) localDeadline(at int64) time.Time {
	return s.sent.Add(time.Duration(at-s.redis) * time.Millisecond)
}

func parseTokens(f []string) ([]int64, error) {
	tokens := make([]int64, len(f))
	for i, s := range f {
		t, err := strconv.ParseInt(s, 10, 64)
		if err != nil || t <= 0 {
			return nil, fmt.Errorf("bad token %q", s)
		}
		tokens[i] = t
	}
	return tokens, nil
}
