// Package fairlockotel reports a fairlock [fairlock.Client]'s waits and
// leases to OpenTelemetry: metrics of how long callers wait and hold, how
// acquisitions end and how many leases are lost, gauges of the waiters and
// holders in this process, and a span for each wait and each lease.
//
//	obs, err := fairlockotel.New() // the global MeterProvider and TracerProvider
//	if err != nil { ... }
//	client, err := fairlock.New(rdb, fairlock.WithObserver(obs))
//
// # Metrics
//
// Every instrument carries the attribute fairlock.semaphore: the semaphore's
// name, or for a multi-lock the names joined with commas in name order
// ([WithoutNameAttribute] drops it). No owner, token or request id is ever
// an attribute, so the number of series grows only with the names in use.
//
//	fairlock.wait.duration   histogram, s   how long a queued request waited (0 for one granted at
//	                                        once); fairlock.outcome granted or abandoned (or opened,
//	                                        for a latch's Wait or a barrier's Await)
//	fairlock.hold.duration   histogram, s   how long a lease was held; fairlock.outcome released or lost
//	fairlock.acquisitions    counter        acquisitions that ended: fairlock.outcome granted, or
//	                                        abandoned with fairlock.reason canceled, deadline,
//	                                        closed, redis, broken (a barrier's round) or other
//	fairlock.leases.lost     counter        leases that ended without a release; fairlock.reason
//	                                        expired, redis, closed or other
//	fairlock.waiters         up-down        requests of this process in a queue now
//	fairlock.holders         up-down        leases of this process held now
//
// An acquisition that neither queued nor was granted (a TryAcquire that
// found no room, bad arguments, Redis unreachable at the first call) is not
// counted: the client reports no event for it. A condition wait
// (semaphore.Cond.Wait) is an acquisition of its
// own: the lease it gives up is released, and its wait runs from the wait
// on the condition to the grant of the lease it returns. A countdown
// latch's Wait (package latch) that had to wait is a wait on the latch's
// name (in fairlock.semaphore): counted in fairlock.waiters while it
// waits, with a "fairlock.wait" span, and in fairlock.wait.duration with
// the outcome opened when the latch opened; one that gives up is
// reported as an abandoned acquisition is. A cyclic barrier's Await
// (package barrier) that waited is reported the same way under the
// barrier's name: opened when its round completed, abandoned when it
// ended otherwise, with the reason broken when another party broke the
// round. The round's last party, which does not wait, is not counted.
//
// # Spans
//
// "fairlock.wait" runs from the moment a request joins a queue to its grant
// (status unset) or to its giving up (status Error, the error's text, and
// fairlock.reason); a request granted at once has no wait span.
// "fairlock.lease" runs from the grant to the release (status unset) or the
// loss (status Error and fairlock.reason). Both carry fairlock.semaphore
// (unless dropped) and are root spans: the client's events carry no
// context.
package fairlockotel

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/fairlock/fairlock"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/fairlock/fairlock/fairlockotel"

// Attribute keys.
const (
	// SemaphoreKey is the semaphore's name (names joined with "," for a
	// multi-lock).
	SemaphoreKey = attribute.Key("fairlock.semaphore")
	// OutcomeKey is granted or abandoned (acquisitions, waits), opened (a
	// latch's or a barrier's waits), released or lost (holds).
	OutcomeKey = attribute.Key("fairlock.outcome")
	// ReasonKey says why a wait was abandoned or a lease lost.
	ReasonKey = attribute.Key("fairlock.reason")
)

// An Option configures [New].
type Option func(*config)

type config struct {
	mp     metric.MeterProvider
	tp     trace.TracerProvider
	noName bool
}

// WithMeterProvider sets the MeterProvider. The default is the global one
// ([otel.GetMeterProvider]) at the time New is called.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithTracerProvider sets the TracerProvider. The default is the global one
// ([otel.GetTracerProvider]) at the time New is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithoutNameAttribute leaves fairlock.semaphore out of every metric and
// span, for deployments whose semaphore names are too many to be series
// (one per user or per job id, say): the metrics then count all semaphores
// together.
func WithoutNameAttribute() Option {
	return func(c *config) { c.noName = true }
}

// Observer implements [fairlock.Observer] with OpenTelemetry. Create it
// with [New]; one Observer may serve several clients. It is safe for
// concurrent use.
type Observer struct {
	cfg    config
	tracer trace.Tracer

	waitDur, holdDur metric.Float64Histogram
	acquisitions     metric.Int64Counter
	lost             metric.Int64Counter
	waiters, holders metric.Int64UpDownCounter

	mu sync.Mutex
	// live pairs each acquisition's start event with its end (by
	// fairlock.Event.ID): a wait from WaitStarted, a lease from Granted.
	live map[uint64]*request
}

// request is what the Observer remembers of one acquisition between its
// events.
type request struct {
	waitSpan  trace.Span // while queued
	leaseSpan trace.Span // while held
	waiting   bool       // counted in fairlock.waiters
	holding   bool       // counted in fairlock.holders
	// ended: the lease's end was seen before its grant (the client reports
	// the grant after the lease has started renewing, so a lease lost at
	// once can be reported first); the grant then opens nothing.
	ended bool
}

// buckets suit waits and holds from a millisecond to minutes.
var buckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// New creates an Observer and its instruments. It fails only if the
// MeterProvider refuses an instrument.
func New(opts ...Option) (*Observer, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	o := &Observer{cfg: cfg, tracer: cfg.tp.Tracer(ScopeName), live: map[uint64]*request{}}
	m := cfg.mp.Meter(ScopeName)
	var errs []error
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	count := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, unit, desc string) metric.Int64UpDownCounter {
		g, err := m.Int64UpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	o.waitDur = hist("fairlock.wait.duration", "How long a request waited in a semaphore's queue (0 when granted at once).")
	o.holdDur = hist("fairlock.hold.duration", "How long a lease was held, to its release or loss.")
	o.acquisitions = count("fairlock.acquisitions", "{acquisition}", "Acquisitions that were granted or that queued and gave up.")
	o.lost = count("fairlock.leases.lost", "{lease}", "Leases that ended without a release.")
	o.waiters = gauge("fairlock.waiters", "{request}", "Requests of this process waiting in a queue.")
	o.holders = gauge("fairlock.holders", "{lease}", "Leases held by this process.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// Observe records e. It implements [fairlock.Observer]: it does not block
// beyond a short lock and the OpenTelemetry SDK's own work.
func (o *Observer) Observe(e fairlock.Event) {
	ctx := context.Background()
	name := o.nameAttrs(e.Names)
	switch e.Kind {
	case fairlock.WaitStarted:
		r := o.begin(e.ID)
		// A request queued again (its ticket dropped while it could not
		// refresh it) keeps its first span.
		if r.waiting {
			o.mu.Unlock()
			return
		}
		r.waiting = true
		_, r.waitSpan = o.tracer.Start(ctx, "fairlock.wait", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(name...))
		o.mu.Unlock()
		o.waiters.Add(ctx, 1, metric.WithAttributes(name...))

	case fairlock.Granted:
		r := o.begin(e.ID)
		waitSpan, waiting := r.waitSpan, r.waiting
		r.waitSpan, r.waiting = nil, false
		if r.ended {
			delete(o.live, e.ID)
		} else {
			r.holding = true
			_, r.leaseSpan = o.tracer.Start(ctx, "fairlock.lease", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(name...))
		}
		ended := r.ended
		o.mu.Unlock()
		if waiting {
			o.waiters.Add(ctx, -1, metric.WithAttributes(name...))
			waitSpan.End()
		}
		if !ended {
			o.holders.Add(ctx, 1, metric.WithAttributes(name...))
		}
		o.waitDur.Record(ctx, e.Wait.Seconds(), metric.WithAttributes(append(name, OutcomeKey.String("granted"))...))
		o.acquisitions.Add(ctx, 1, metric.WithAttributes(append(name, OutcomeKey.String("granted"))...))

	case fairlock.WaitAbandoned:
		o.mu.Lock()
		r := o.live[e.ID]
		delete(o.live, e.ID)
		o.mu.Unlock()
		reason := abandonReason(e.Err)
		if r != nil && r.waiting {
			o.waiters.Add(ctx, -1, metric.WithAttributes(name...))
			r.waitSpan.SetAttributes(ReasonKey.String(reason))
			r.waitSpan.SetStatus(codes.Error, errText(e.Err))
			r.waitSpan.End()
		}
		o.waitDur.Record(ctx, e.Wait.Seconds(), metric.WithAttributes(append(name, OutcomeKey.String("abandoned"))...))
		o.acquisitions.Add(ctx, 1, metric.WithAttributes(append(name, OutcomeKey.String("abandoned"), ReasonKey.String(reason))...))

	case fairlock.WaitEnded:
		// A wait that grants nothing ended (a latch opened, a barrier's
		// round completed): no lease.
		o.mu.Lock()
		r := o.live[e.ID]
		delete(o.live, e.ID)
		o.mu.Unlock()
		if r != nil && r.waiting {
			o.waiters.Add(ctx, -1, metric.WithAttributes(name...))
			r.waitSpan.End()
		}
		o.waitDur.Record(ctx, e.Wait.Seconds(), metric.WithAttributes(append(name, OutcomeKey.String("opened"))...))

	case fairlock.LeaseReleased, fairlock.LeaseLost:
		o.mu.Lock()
		r := o.live[e.ID]
		var span trace.Span
		holding := false
		switch {
		case r == nil:
			// Ended before its grant was reported: remember, so the grant
			// opens nothing.
			o.live[e.ID] = &request{ended: true}
		case r.holding:
			span, holding = r.leaseSpan, true
			delete(o.live, e.ID)
		default:
			r.ended = true
		}
		o.mu.Unlock()
		outcome := "released"
		if e.Kind == fairlock.LeaseLost {
			outcome = "lost"
			reason := lostReason(e.Err)
			o.lost.Add(ctx, 1, metric.WithAttributes(append(name, ReasonKey.String(reason))...))
			if span != nil {
				span.SetAttributes(ReasonKey.String(reason))
				span.SetStatus(codes.Error, errText(e.Err))
			}
		}
		if holding {
			o.holders.Add(ctx, -1, metric.WithAttributes(name...))
			span.End()
		}
		o.holdDur.Record(ctx, e.Held.Seconds(), metric.WithAttributes(append(name, OutcomeKey.String(outcome))...))
	}
}

// begin returns id's request, made if new, with o.mu held.
func (o *Observer) begin(id uint64) *request {
	o.mu.Lock()
	r := o.live[id]
	if r == nil {
		r = &request{}
		o.live[id] = r
	}
	return r
}

// nameAttrs returns the name attribute, or none. Its capacity is one more,
// for the caller's outcome.
func (o *Observer) nameAttrs(names []string) []attribute.KeyValue {
	if o.cfg.noName {
		return make([]attribute.KeyValue, 0, 2)
	}
	out := make([]attribute.KeyValue, 1, 3)
	if len(names) == 1 {
		out[0] = SemaphoreKey.String(names[0])
	} else {
		out[0] = SemaphoreKey.String(strings.Join(names, ","))
	}
	return out
}

// abandonReason classifies why a wait ended without a grant: an error
// that names its own reason (AbandonReason: a barrier's round that
// another party broke is "broken") gives it.
func abandonReason(err error) string {
	var named interface{ AbandonReason() string }
	switch {
	case errors.As(err, &named):
		return named.AbandonReason()
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, fairlock.ErrClosed):
		return "closed"
	case errors.Is(err, fairlock.ErrRedis):
		return "redis"
	}
	return "other"
}

// lostReason classifies why a lease ended without a release: its client was
// closed (closed), Redis could not be reached to renew or release it in time
// (redis), Redis no longer had it (expired). A release cut short by its
// caller's context is other.
func lostReason(err error) string {
	switch {
	case errors.Is(err, fairlock.ErrClosed):
		return "closed"
	case errors.Is(err, fairlock.ErrRedis):
		return "redis"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "other"
	case errors.Is(err, fairlock.ErrLeaseLost):
		return "expired"
	}
	return "other"
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
