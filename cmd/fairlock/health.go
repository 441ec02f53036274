package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisHealth follows whether Redis answers: a go-redis hook on the
// client fairlock sends its commands through, which notes when Redis last
// answered and when a command last got no answer. run and elect read it
// when a wait runs out, to tell a busy lock (exit 75) from a Redis that
// did not answer (exit 70).
type redisHealth struct {
	where string // Redis, as messages name it: "Redis at HOST:PORT", "the Cluster at ..."

	mu      sync.Mutex
	okAt    time.Time // when Redis last answered (a reply, an error reply included)
	failAt  time.Time // when a command last got no answer
	failErr error     // and why
}

func newRedisHealth(where string) *redisHealth { return &redisHealth{where: where} }

func (h *redisHealth) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *redisHealth) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.note(ctx, err)
		return err
	}
}

func (h *redisHealth) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.note(ctx, err)
		return err
	}
}

// note records a command's outcome: an answer, or none. A command cut
// short by its own context's end says nothing about Redis (its caller gave
// up; a wait that runs out cuts its status reads short), and is not noted.
func (h *redisHealth) note(ctx context.Context, err error) {
	if err != nil && ctx.Err() != nil {
		return
	}
	var reply redis.Error // Redis answered, with an error reply (or nil)
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil || errors.As(err, &reply) {
		h.okAt = now
		return
	}
	h.failAt, h.failErr = now, err
}

// errNoAnswer matches the error of a wait that ran out because Redis did
// not answer.
//
//lint:ignore ST1005 "Redis" is a name; the error stands inside a sentence ("..., but Redis did not answer").
var errNoAnswer = errors.New("Redis did not answer")

// troubleSince returns nil if Redis has answered since start, the last
// command that got no answer came before that answer, and Redis answers a
// PING now (within probeWait); else an error matching errNoAnswer that
// names Redis (its address) and what happened (refused, timed out, ...).
func (h *redisHealth) troubleSince(start time.Time, ping func(context.Context) error) error {
	h.mu.Lock()
	okAt, failAt, failErr := h.okAt, h.failAt, h.failErr
	h.mu.Unlock()
	switch {
	case failAt.After(start) && !okAt.After(failAt):
		return h.noAnswer(failErr)
	case !okAt.After(start):
		return h.noAnswer(context.DeadlineExceeded)
	}
	// Redis answered during the wait: it is busy if it still answers now.
	if perr := pingWithin(ping, probeWait); perr != nil {
		return h.noAnswer(perr)
	}
	return nil
}

// pingWithin runs ping under a context of d and returns by d, whatever
// the client does with that context (go-redis bounds a read by its read
// timeout, not by the context: against a stalled Redis a PING takes
// seconds); a PING still running then is left to the client, which the
// command closes as it exits.
func pingWithin(ping func(context.Context) error, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ping(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// probeWait bounds the PING that checks Redis as a wait runs out.
const probeWait = time.Second

// noAnswer is errNoAnswer with Redis's address and what happened.
func (h *redisHealth) noAnswer(err error) error {
	return fmt.Errorf("%w (%s: %s)", errNoAnswer, h.where, whatHappened(err))
}

// whatHappened says in a few words why a command got no answer.
func whatHappened(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection reset"
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return "cannot resolve " + dns.Name
	}
	return err.Error()
}
