package fairlock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

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

// Both scripts start with queue.lua, the shared model and grant rule. They
// run through Script.Run: EVALSHA, falling back to EVAL after SCRIPT FLUSH or
// on a Redis that has not seen them yet.
var (
	acquireScript = redis.NewScript(queueLua + "\n" + acquireLua)
	releaseScript = redis.NewScript(queueLua + "\n" + releaseLua)
)

// nudgeScript pushes an empty wake-up onto a wake list, to end a blocked
// BLPOP at once when a client closes. It changes no semaphore state.
var nudgeScript = redis.NewScript(`redis.call('RPUSH', KEYS[1], '')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1`)

const capacityErrPrefix = "FAIRLOCK_CAPACITY "

// fail turns an error from Redis or the connection into fairlock's error
// for op on name. It is the one place where Redis errors are mapped.
func fail(ctx context.Context, op, name string, err error) error {
	// Only the caller's context makes a context error the caller's; an
	// internal timeout means Redis did not answer in time.
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("fairlock: %s %q: %w", op, name, ctxErr)
	}
	if errors.Is(err, ErrRedis) {
		return fmt.Errorf("fairlock: %s %q: %w", op, name, err)
	}
	if msg := err.Error(); strings.HasPrefix(msg, capacityErrPrefix) {
		return fmt.Errorf("fairlock: %s %q: %w: stored capacity is %s", op, name, ErrCapacityMismatch, strings.TrimPrefix(msg, capacityErrPrefix))
	}
	return fmt.Errorf("fairlock: %s %q: %w: %w", op, name, ErrRedis, err)
}

// reply reads a script's array reply as integers and strings.
type reply []any

func (r reply) int(i int) (int64, error) {
	if i >= len(r) {
		return 0, fmt.Errorf("fairlock: short script reply %v", []any(r))
	}
	switch v := r[i].(type) {
	case int64:
		return v, nil
	case string:
		return strconv.ParseInt(v, 10, 64)
	}
	return 0, fmt.Errorf("fairlock: unexpected script reply %v", []any(r))
}

// parseWake splits a wake-up "ticket token" pushed by queue.lua's pump.
func parseWake(s string) (ticket string, token int64, ok bool) {
	ticket, tok, found := strings.Cut(s, " ")
	if !found {
		return "", 0, false
	}
	token, err := strconv.ParseInt(tok, 10, 64)
	return ticket, token, err == nil
}
