package election_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/internal/redistest"
)

// BenchmarkHandover measures, on redis-server, the time from a leader's
// Resign to its queued successor's Campaign returning, and to an
// observer (a third client) delivering the successor.
func BenchmarkHandover(b *testing.B) {
	be := redistest.RealBackend(b)
	prefix := redistest.Prefix(b)
	newElection := func() *election.Election {
		c, err := fairlock.New(be.Client(b), fairlock.WithPrefix(prefix))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		e, err := election.New(c, "bench")
		if err != nil {
			b.Fatal(err)
		}
		return e
	}
	ea, eb, eo := newElection(), newElection(), newElection()
	inspect := be.Client(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changes := eo.Observe(ctx)
	var toLead, toObserve []time.Duration
	l, err := ea.Campaign(ctx, "x")
	if err != nil {
		b.Fatal(err)
	}
	<-changes
	for b.Loop() {
		type won struct {
			l   *election.Leadership
			at  time.Time
			err error
		}
		ch := make(chan won, 1)
		go func() {
			nl, err := eb.Campaign(ctx, "y")
			ch <- won{nl, time.Now(), err}
		}()
		for { // wait until the successor is queued
			if n, _ := inspect.ZCard(ctx, prefix+"{bench}:q").Result(); n == 1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		t0 := time.Now()
		if err := l.Resign(ctx); err != nil {
			b.Fatal(err)
		}
		for info := range changes { // the zero Info may come first
			if info.Term != 0 {
				toObserve = append(toObserve, time.Since(t0))
				break
			}
		}
		w := <-ch
		if w.err != nil {
			b.Fatal(w.err)
		}
		toLead = append(toLead, w.at.Sub(t0))
		l = w.l
		ea, eb = eb, ea
	}
	_ = l.Resign(ctx)
	p50 := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds())
	}
	b.ReportMetric(p50(toLead), "resign-to-lead-p50-µs")
	b.ReportMetric(p50(toObserve), "resign-to-observed-p50-µs")
}
