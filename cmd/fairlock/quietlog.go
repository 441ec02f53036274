package main

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// logSummaryEvery is how often -v repeats a diagnostic that keeps coming
// (a renewal failing while Redis is gone, go-redis's failed dials): once
// when it first comes, then at most once a logSummaryEvery, with how many
// times it came meanwhile.
const logSummaryEvery = 10 * time.Second

// quietHandler passes records on to h, but not the same one over and
// over: a record like one logged less than every ago (the same level,
// message and error) is counted instead, and the count is logged with
// the next one logged (attributes repeated and over), which comes once
// every has passed, when a new kind of record comes (the state changed:
// the count of every other kind is logged then, with its last record), or
// at flush. Kinds that alternate (a failing renewal and go-redis's failed
// dial) are each held back so.
type quietHandler struct {
	h     slog.Handler
	every time.Duration
	now   func() time.Time
	st    *quietState // shared with the handlers WithAttrs and WithGroup make
}

type quietState struct {
	mu    sync.Mutex
	kinds map[string]*quietKind
	order []string // the kinds' keys, in the order they first came
}

// quietKind is one kind of record: when it was last logged, and what has
// been held back since.
type quietKind struct {
	logged time.Time
	held   int
	last   slog.Record  // the last record held back
	h      slog.Handler // the handler it came to
}

func newQuietHandler(h slog.Handler, every time.Duration) *quietHandler {
	return &quietHandler{h: h, every: every, now: time.Now, st: &quietState{kinds: map[string]*quietKind{}}}
}

func (q *quietHandler) Enabled(ctx context.Context, l slog.Level) bool { return q.h.Enabled(ctx, l) }

func (q *quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &quietHandler{h: q.h.WithAttrs(as), every: q.every, now: q.now, st: q.st}
}

func (q *quietHandler) WithGroup(name string) slog.Handler {
	return &quietHandler{h: q.h.WithGroup(name), every: q.every, now: q.now, st: q.st}
}

// kindOf is what makes two records the same kind: level, message, error,
// the digits aside (a connection's local port, a deadline's time).
func kindOf(r slog.Record) string {
	key := r.Level.String() + "\x00" + r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "error" || a.Key == "cause" {
			key += "\x00" + a.Value.String()
		}
		return true
	})
	return strings.Map(func(c rune) rune {
		if c >= '0' && c <= '9' {
			return -1
		}
		return c
	}, key)
}

// maxKinds bounds the kinds a quietHandler remembers: past it, what they
// hold back is logged and they are forgotten.
const maxKinds = 256

func (q *quietHandler) Handle(ctx context.Context, r slog.Record) error {
	now := q.now()
	key := kindOf(r)
	st := q.st
	st.mu.Lock()
	defer st.mu.Unlock()
	k := st.kinds[key]
	if k == nil && len(st.order) >= maxKinds {
		st.flushLocked(ctx, now, "")
		st.kinds, st.order = map[string]*quietKind{}, nil
	}
	if k == nil {
		k = &quietKind{}
		st.kinds[key] = k
		st.order = append(st.order, key)
	}
	if k.logged.IsZero() {
		// A new kind: the state changed. What the others held back is
		// logged now, and each of those is logged at once when it comes
		// again.
		st.flushLocked(ctx, now, key)
		return k.log(ctx, q.h, r, now)
	}
	if now.Sub(k.logged) < q.every {
		k.held++
		k.last, k.h = r.Clone(), q.h
		return nil
	}
	return k.log(ctx, q.h, r, now)
}

// log logs r through h, with the count of the records held back since
// the kind was last logged.
func (k *quietKind) log(ctx context.Context, h slog.Handler, r slog.Record, now time.Time) error {
	if k.held > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("repeated", k.held), slog.Duration("over", now.Sub(k.logged).Round(time.Second)))
	}
	k.logged, k.held = now, 0
	return h.Handle(ctx, r)
}

// flushLocked logs the last held-back record of every kind but except,
// with its count, in the order the kinds first came; such a kind is then
// new again (logged at once when it next comes).
func (st *quietState) flushLocked(ctx context.Context, now time.Time, except string) {
	for _, key := range st.order {
		if k := st.kinds[key]; key != except && k.held > 0 {
			_ = k.log(ctx, k.h, k.last, now)
			k.logged = time.Time{}
		}
	}
}

// flush logs what is held back, as the command exits.
func (q *quietHandler) flush() {
	q.st.mu.Lock()
	defer q.st.mu.Unlock()
	q.st.flushLocked(context.Background(), q.now(), "")
}
