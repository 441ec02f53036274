package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// -v's logger logs a diagnostic that keeps coming once, then with a count
// at most every logSummaryEvery, and at once when another kind comes (the
// state changed) or the command exits.
func TestVerboseLogIsRateLimited(t *testing.T) {
	var out bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	q := newQuietHandler(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}), 10*time.Second)
	q.now = func() time.Time { return now }
	log := slog.New(q).With("semaphores", []string{"x"})
	refused := errors.New("connection refused")
	renewalFailed := func() { log.Warn("renewal failed", "error", refused) }

	// Redis gone: a failure every 200 ms for 25 s, each followed by
	// go-redis's failed dial.
	for range 125 {
		renewalFailed()
		log.Debug("failed to dial", "source", "go-redis")
		now = now.Add(200 * time.Millisecond)
	}
	// Timeouts on connections of different local ports are one kind.
	for port := range 30 {
		log.Warn("renewal failed", "error", fmt.Sprintf("read tcp 127.0.0.1:%d->127.0.0.1:6379: i/o timeout", 40000+port))
	}
	// Back: another kind of record, then the same failure again, once.
	log.Info("renewed")
	renewalFailed()
	log.Warn("renewal failed", "error", errors.New("i/o timeout")) // another error: another kind
	q.flush()

	dial := `level=DEBUG msg="failed to dial" semaphores=[x] source=go-redis`
	want := []string{
		`level=WARN msg="renewal failed" semaphores=[x] error="connection refused"`,
		dial,
		`level=WARN msg="renewal failed" semaphores=[x] error="connection refused" repeated=49 over=10s`,
		dial + ` repeated=49 over=10s`,
		`level=WARN msg="renewal failed" semaphores=[x] error="connection refused" repeated=49 over=10s`,
		dial + ` repeated=49 over=10s`,
		`level=WARN msg="renewal failed" semaphores=[x] error="connection refused" repeated=24 over=5s`,
		dial + ` repeated=24 over=5s`,
		`level=WARN msg="renewal failed" semaphores=[x] error="read tcp 127.0.0.1:40000->127.0.0.1:6379: i/o timeout"`,
		`level=WARN msg="renewal failed" semaphores=[x] error="read tcp 127.0.0.1:40029->127.0.0.1:6379: i/o timeout" repeated=29 over=0s`,
		`level=INFO msg=renewed semaphores=[x]`,
		`level=WARN msg="renewal failed" semaphores=[x] error="connection refused"`,
		`level=WARN msg="renewal failed" semaphores=[x] error="i/o timeout"`,
	}
	got := strings.Split(strings.TrimSpace(out.String()), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("logged:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
