package fairlockotel_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fairlock/fairlock/barrier"
	"github.com/fairlock/fairlock/fairlockotel"
	"go.opentelemetry.io/otel/codes"
)

// A barrier's Await that waited counts as a waiter of the barrier's name
// while it waits, under a "fairlock.wait" span, and ends in
// fairlock.wait.duration as opened (its round completed) or abandoned;
// an abandoned one counts in fairlock.acquisitions with its reason,
// broken when another party broke its round. The round's last party,
// which does not wait, is not counted. The observer then remembers
// nothing of them.
func TestBarrierAwaitsCounted(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	c, other := r.client(), r.client()
	newBarrier := func(name string, parties int) (*barrier.Barrier, *barrier.Barrier) {
		t.Helper()
		a, err := barrier.New(c, name, parties)
		if err != nil {
			t.Fatal(err)
		}
		b, err := barrier.New(other, name, parties)
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	}

	// A completed round: the first party waits, the last does not.
	step, stepLast := newBarrier("step", 2)
	done := make(chan error, 2)
	go func() { _, err := step.Await(ctx); done <- err }()
	waitFor(t, "the first party counted", func() bool { return r.gauge("fairlock.waiters", "step") == 1 })
	if a, err := stepLast.Await(ctx); err != nil || a.Round != 1 {
		t.Fatalf("last party's Await() = %+v, %v; want round 1", a, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("first party's Await() = %v once the round completed", err)
	}

	// A broken round: one party's context ends, which breaks the other's.
	shut, shutOther := newBarrier("shut", 3)
	go func() { _, err := shut.Await(ctx); done <- err }()
	waitFor(t, "the first party counted", func() bool { return r.gauge("fairlock.waiters", "shut") == 1 })
	cctx, cancel := context.WithCancel(ctx)
	cancelled := make(chan error, 1)
	go func() { _, err := shutOther.Await(cctx); cancelled <- err }()
	waitFor(t, "the second party counted", func() bool { return r.gauge("fairlock.waiters", "shut") == 2 })
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Await() = %v", err)
	}
	if err := <-done; !errors.Is(err, barrier.ErrBrokenBarrier) {
		t.Fatalf("Await() of a broken round = %v, want ErrBrokenBarrier", err)
	}

	if s, h := r.gauge("fairlock.waiters", "step"), r.gauge("fairlock.waiters", "shut"); s != 0 || h != 0 {
		t.Fatalf("fairlock.waiters after the rounds ended: step %d, shut %d; want 0", s, h)
	}
	m := r.metrics()
	waits := hists(t, m["fairlock.wait.duration"])
	for k, want := range map[string]uint64{
		"fairlock.outcome=opened,fairlock.semaphore=step":    1,
		"fairlock.outcome=abandoned,fairlock.semaphore=shut": 2,
	} {
		if waits[k].Count != want {
			t.Errorf("fairlock.wait.duration{%s} counts %d waits, want %d (all: %v)", k, waits[k].Count, want, waits)
		}
	}
	if len(waits) != 2 {
		t.Errorf("fairlock.wait.duration has %d series, want 2: %v", len(waits), waits)
	}
	acq := sums(t, m["fairlock.acquisitions"])
	want := map[string]int64{
		"fairlock.outcome=abandoned,fairlock.reason=broken,fairlock.semaphore=shut":   1,
		"fairlock.outcome=abandoned,fairlock.reason=canceled,fairlock.semaphore=shut": 1,
	}
	if !mapsEqual(acq, want) {
		t.Errorf("fairlock.acquisitions = %v, want %v", acq, want)
	}
	if h := r.gauge("fairlock.holders", "step"); h != 0 {
		t.Errorf("fairlock.holders of the barrier = %d, want 0: a round grants nothing", h)
	}

	reasons := map[string]int{}
	for _, s := range r.spans.Ended() {
		if s.Name() != "fairlock.wait" {
			t.Errorf("span %q, want only fairlock.wait", s.Name())
			continue
		}
		reason := ""
		for _, kv := range s.Attributes() {
			if kv.Key == fairlockotel.ReasonKey {
				reason = kv.Value.AsString()
			}
		}
		if (reason == "") != (s.Status().Code == codes.Unset) {
			t.Errorf("wait span with reason %q has status %v", reason, s.Status())
		}
		reasons[reason]++
	}
	if reasons[""] != 1 || reasons["broken"] != 1 || reasons["canceled"] != 1 || len(reasons) != 3 {
		t.Errorf("wait spans by reason: %v, want one each of opened (none), broken and canceled", reasons)
	}
	if n := len(r.spans.Started()) - len(r.spans.Ended()); n != 0 {
		t.Errorf("%d spans not ended", n)
	}
	if n := fairlockotel.Live(r.obs); n != 0 {
		t.Errorf("the observer remembers %d waits, want 0", n)
	}
}
